"""Models in from Hugging Face and TransformerLens: the logits agree with the source library,
folding agrees with TransformerLens tensor by tensor, and every bad folder gets one clear line."""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models

import qkov
from qkov.cli import main
from qkov.interop import fold, save_transformer_lens, to_hooked_transformer, to_transformer_lens

transformers = pytest.importorskip("transformers")
tl = pytest.importorskip("transformer_lens")
transformers.logging.set_verbosity_error()
logging.getLogger("transformer_lens").setLevel(logging.ERROR)

FP32_TOLERANCE = 1e-4  # the bound for float32 logits; measured: at most 3e-7 on these shapes
FP64_TOLERANCE = 1e-10


def hf_model(n_layers=2, n_heads=3, d_model=12, d_vocab=23, n_ctx=9, seed=0, **extra):
    """A random GPT-2 built locally, with LayerNorm weights and biases drawn too (GPT-2 initialises
    them to 1 and 0, which would make folding them trivial)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=n_layers,
        n_head=n_heads,
        n_embd=d_model,
        vocab_size=d_vocab,
        n_positions=n_ctx,
        bos_token_id=0,
        eos_token_id=0,
        **extra,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln_" in name:
                param.copy_(torch.randn_like(param) * 0.3 + ("weight" in name))
            elif name.endswith("bias"):
                param.copy_(torch.randn_like(param) * 0.1)
    return model


def tl_model(attn_only: bool, n_ctx=9, d_vocab=23, seed=0, positions="standard", normalization="LN"):
    """A random TransformerLens model with LayerNorm (attention-only or with MLPs), every weight
    and bias drawn."""
    cfg = tl.HookedTransformerConfig(
        n_layers=2,
        d_model=12,
        n_heads=3,
        d_head=4,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=attn_only,
        d_mlp=None if attn_only else 20,
        act_fn=None if attn_only else "gelu_new",
        normalization_type=normalization,
        positional_embedding_type=positions,
        device="cpu",
        seed=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tl.HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shift = 1.0 if name.endswith(".w") else 0.0
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3 + shift)
    return model


TOKENS = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(5))


def centred(logits):
    return logits - logits.mean(-1, keepdim=True)


# --- logits agree with the source library ---------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, FP32_TOLERANCE), (torch.float64, FP64_TOLERANCE)]
)
@pytest.mark.parametrize("act", ["gelu_new", "gelu", "relu"])
def test_hf_logits_agree_unfolded_and_folded(dtype, tolerance, act):
    hf = hf_model(activation_function=act).to(dtype)
    theirs = hf(TOKENS).logits.detach()
    model = qkov.from_hf(hf, fold=False)
    assert model.cfg.normalization == "LN" and model.cfg.source == "huggingface" and model.W_E.dtype == dtype
    torch.testing.assert_close(model(TOKENS), theirs, rtol=0, atol=tolerance)
    folded = qkov.from_hf(hf)
    assert folded.cfg.normalization == "LNPre"
    ours = folded(TOKENS)
    # folding keeps the log-probabilities, and the logits up to a constant per position
    torch.testing.assert_close(ours.log_softmax(-1), theirs.log_softmax(-1), rtol=0, atol=tolerance)
    torch.testing.assert_close(centred(ours), centred(theirs), rtol=0, atol=tolerance)
    assert not torch.allclose(ours, theirs, atol=1e-3)  # centring the unembedding did shift them


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, FP32_TOLERANCE), (torch.float64, FP64_TOLERANCE)]
)
@pytest.mark.parametrize("attn_only", [True, False])
def test_transformer_lens_logits_agree_unfolded_and_folded(dtype, tolerance, attn_only):
    hooked = tl_model(attn_only).to(dtype)
    theirs = hooked(TOKENS).detach()
    model = qkov.from_transformer_lens(hooked, fold=False)
    assert model.cfg.source == "transformer_lens" and model.cfg.has_mlp == (not attn_only)
    torch.testing.assert_close(model(TOKENS), theirs, rtol=0, atol=tolerance)
    ours = qkov.from_transformer_lens(hooked)(TOKENS)
    torch.testing.assert_close(ours.log_softmax(-1), theirs.log_softmax(-1), rtol=0, atol=tolerance)
    torch.testing.assert_close(centred(ours), centred(theirs), rtol=0, atol=tolerance)
    # and back: qkov's model as a HookedTransformer gives the same logits
    torch.testing.assert_close(to_hooked_transformer(model)(TOKENS), theirs, rtol=0, atol=tolerance)


# --- folding is TransformerLens' -----------------------------------------------------------------


def transformer_lens_folded(model: qkov.Transformer) -> dict[str, torch.Tensor]:
    hooked = to_hooked_transformer(model)
    state = {name: t.clone() for name, t in hooked.state_dict().items()}
    hooked.load_and_process_state_dict(
        state, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )
    return {name: t for name, t in hooked.state_dict().items() if not name.endswith(("mask", "IGNORE"))}


@pytest.mark.parametrize("source", ["hf", "tl-attn-only", "tl-mlp", "tl-no-norm"])
def test_folding_matches_transformer_lens_tensor_by_tensor(source):
    """TransformerLens folds in float32 (it upcasts lower precisions and downcasts float64), so
    the comparison is in float32; measured: bit-identical on these shapes."""
    if source == "hf":
        model = qkov.from_hf(hf_model(), fold=False)
    else:
        norm = "none" if source == "tl-no-norm" else "LN"
        model = qkov.from_transformer_lens(
            tl_model(source == "tl-attn-only", normalization=None if norm == "none" else norm), fold=False
        )
    ours = to_transformer_lens(fold(model).model)
    theirs = transformer_lens_folded(model)
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_folding_leaves_the_model_and_its_dtype():
    model = qkov.from_hf(hf_model().double(), fold=False)
    before = {n: p.clone() for n, p in model.named_parameters()}
    folded = fold(model)
    assert folded.note is None and folded.model.W_E.dtype == torch.float64
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not any(name.endswith((".w", ".b")) for name, _ in folded.model.named_parameters())


def test_shortformer_layer_norm_is_kept_unfolded_and_said_so():
    model = qkov.from_transformer_lens(tl_model(False, positions="shortformer"), fold=False)
    folded = fold(model)
    assert folded.model.cfg.normalization == "LN"
    assert "shortformer" in folded.note and "\n" not in folded.note
    # what was done (centring, value biases) is exact
    torch.testing.assert_close(
        folded.model(TOKENS).log_softmax(-1), model(TOKENS).log_softmax(-1), rtol=0, atol=FP32_TOLERANCE
    )
    with pytest.warns(qkov.interop.FoldNote, match="shortformer"):
        qkov.from_transformer_lens(tl_model(False, positions="shortformer"))


# --- folders, checkpoints and the command line ----------------------------------------------------


def gpt2_folder(path, tokenizer=True, **kwargs):
    model = hf_model(**kwargs)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        vocab = {chr(97 + i): i for i in range(23)}
        (path / "tokenizer.json").write_text(Tokenizer(models.BPE(vocab=vocab, merges=[])).to_str())
    return model


def test_hf_folder_imports_by_command_and_loads_as_an_ordinary_checkpoint(tmp_path, capsys):
    hf = gpt2_folder(tmp_path / "gpt2")
    main(["import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "qkov")])
    assert "imported 2 layers x 3 heads" in capsys.readouterr().err
    model = qkov.load(tmp_path / "qkov")
    assert model.cfg.source == "huggingface" and model.cfg.normalization == "LNPre"
    assert model.tokenizer.get_vocab_size() == 23
    theirs = hf(TOKENS).logits.detach()
    torch.testing.assert_close(
        model(TOKENS).log_softmax(-1), theirs.log_softmax(-1), rtol=0, atol=FP32_TOLERANCE
    )
    torch.testing.assert_close(
        model.double()(TOKENS).log_softmax(-1), theirs.double().log_softmax(-1), atol=1e-5, rtol=0
    )
    main(["import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "raw"), "--no-fold"])
    raw = qkov.load(tmp_path / "raw")
    assert raw.cfg.normalization == "LN"
    torch.testing.assert_close(raw(TOKENS), theirs, rtol=0, atol=FP32_TOLERANCE)


def test_hf_folder_with_a_pickled_pytorch_model_bin_imports_the_same(tmp_path):
    hf = gpt2_folder(tmp_path / "gpt2", tokenizer=False)
    torch.save(hf.state_dict(), tmp_path / "gpt2" / "pytorch_model.bin")
    (tmp_path / "gpt2" / "model.safetensors").unlink()
    model = qkov.from_hf(tmp_path / "gpt2", fold=False)
    torch.testing.assert_close(model(TOKENS), hf(TOKENS).logits.detach(), rtol=0, atol=FP32_TOLERANCE)


def test_untied_hf_folder_uses_its_lm_head(tmp_path):
    hf = gpt2_folder(tmp_path / "gpt2", tie_word_embeddings=False)
    torch.testing.assert_close(
        qkov.from_hf(tmp_path / "gpt2", fold=False)(TOKENS),
        hf(TOKENS).logits.detach(),
        rtol=0,
        atol=FP32_TOLERANCE,
    )


@pytest.mark.parametrize("attn_only", [True, False])
def test_transformer_lens_folder_imports_by_command(tmp_path, attn_only):
    hooked = tl_model(attn_only)
    save_transformer_lens(hooked, tmp_path / "tl")
    main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "qkov")])
    model = qkov.load(tmp_path / "qkov")
    assert model.cfg.source == "transformer_lens" and model.cfg.normalization == "LNPre"
    theirs = hooked(TOKENS).detach()
    torch.testing.assert_close(
        model(TOKENS).log_softmax(-1), theirs.log_softmax(-1), rtol=0, atol=FP32_TOLERANCE
    )


def test_shortformer_note_reaches_the_command_line(tmp_path, capsys):
    save_transformer_lens(tl_model(False, positions="shortformer"), tmp_path / "tl")
    main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "qkov")])
    err = capsys.readouterr().err
    assert "note: LayerNorm kept unfolded: shortformer" in err
    assert qkov.load(tmp_path / "qkov").cfg.normalization == "LN"


def rewrite_config(folder, **changes):
    data = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(data))


def replace_tensor(folder, name, value):
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    tensors[name] = value
    save_file(tensors, folder / "model.safetensors")


def bad_folder(kind, folder):
    """Each broken source: (how to break it, what the one line must say)."""
    hf = lambda: gpt2_folder(folder, tokenizer=False)  # noqa: E731
    tlf = lambda **kw: save_transformer_lens(tl_model(False, **kw), folder)  # noqa: E731
    cases = {
        "corrupt pickle": (
            lambda: (
                hf(),
                (folder / "model.safetensors").unlink(),
                (folder / "pytorch_model.bin").write_bytes(b"x"),
            ),
            "pytorch_model.bin: not a readable PyTorch pickle",
        ),
        "corrupt": (
            lambda: (hf(), (folder / "model.safetensors").write_bytes(b"\x00" * 50)),
            "truncated or corrupt",
        ),
        "truncated": (
            lambda: (
                hf(),
                (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:300]),
            ),
            "truncated or corrupt",
        ),
        "shapes": (
            lambda: (hf(), rewrite_config(folder, n_embd=24)),
            r"tensor wte.weight has shape \(23, 12\), config.json expects \(23, 24\)",
        ),
        "nan": (
            lambda: (
                hf(),
                replace_tensor(
                    folder, "transformer.h.1.attn.c_attn.weight", torch.full((12, 36), float("nan"))
                ),
            ),
            "tensor h.1.attn.c_attn.weight has non-finite values",
        ),
        "missing": (
            lambda: (
                hf(),
                replace_tensor(folder, "transformer.h.1.ln_2.bias", torch.zeros(12)),
                rewrite_config(folder, n_layer=3),
            ),
            "missing tensor h.2.ln_1.weight",
        ),
        "llama": (
            lambda: (hf(), rewrite_config(folder, model_type="llama")),
            "model type other than GPT-2 is not supported .model_type='llama'",
        ),
        "inverse layer scale": (
            lambda: (hf(), rewrite_config(folder, scale_attn_by_inverse_layer_idx=True)),
            "scale_attn_by_inverse_layer_idx",
        ),
        "activation": (
            lambda: (hf(), rewrite_config(folder, activation_function="swish")),
            "activation_function='swish'",
        ),
        "no config": (lambda: (hf(), (folder / "config.json").unlink()), "no config.json"),
        "bad json": (lambda: (hf(), (folder / "config.json").write_text("{")), "not valid JSON"),
        "unknown kind": (
            lambda: (hf(), (folder / "config.json").write_text("{}")),
            "neither a Hugging Face config",
        ),
        "rotary": (
            lambda: (tlf(), rewrite_config(folder, positional_embedding_type="rotary")),
            "positional_embedding_type='rotary'",
        ),
        "gqa": (
            lambda: (tlf(), rewrite_config(folder, n_key_value_heads=1)),
            "grouped-query attention is not supported .n_key_value_heads=1",
        ),
        "parallel": (
            lambda: (tlf(), rewrite_config(folder, parallel_attn_mlp=True)),
            "parallel attention and MLP .*parallel_attn_mlp",
        ),
        "rms": (
            lambda: (tlf(), rewrite_config(folder, normalization_type="RMS")),
            "normalization_type='RMS'",
        ),
        "final rms": (lambda: (tlf(), rewrite_config(folder, final_rms=True)), "final_rms"),
        "solu": (lambda: (tlf(), rewrite_config(folder, act_fn="solu_ln")), "act_fn"),
        "tl nan": (
            lambda: (tlf(), replace_tensor(folder, "blocks.0.mlp.W_in", torch.full((12, 20), float("inf")))),
            "tensor blocks.0.mlp.W_in has non-finite values",
        ),
        "tl shapes": (
            lambda: (tlf(), rewrite_config(folder, d_mlp=21)),
            r"tensor blocks.0.mlp.W_in has shape \(12, 20\), config expects \(12, 21\)",
        ),
        "no folder": (lambda: None, "no such folder"),
    }
    return cases[kind]


BAD = [
    *("corrupt pickle", "corrupt", "truncated", "shapes", "nan", "missing", "llama", "inverse layer scale"),
    *("activation", "no config", "bad json", "unknown kind", "rotary", "gqa", "parallel", "rms"),
    *("final rms", "solu", "tl nan", "tl shapes", "no folder"),
]


@pytest.mark.parametrize("kind", BAD)
def test_bad_source_gives_one_line_and_exit_status_2(tmp_path, capsys, kind):
    make, message = bad_folder(kind, tmp_path / "src")
    make()
    capsys.readouterr()  # transformers' own progress output while the folder was written
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkov: error: ") and "\n" not in err and "Traceback" not in err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out").exists()  # nothing half-written
    with pytest.raises(qkov.QkovError, match=message):
        qkov.interop.import_checkpoint(tmp_path / "src", tmp_path / "out")


def test_imported_model_survives_save_load_and_double(tmp_path):
    model = qkov.from_hf(hf_model())
    qkov.save(model, tmp_path)
    loaded = qkov.load(tmp_path)
    assert loaded.cfg == model.cfg
    np.testing.assert_array_equal(loaded(TOKENS).detach().numpy(), model(TOKENS).detach().numpy())
    torch.testing.assert_close(loaded.double()(TOKENS).float(), model(TOKENS), rtol=0, atol=FP32_TOLERANCE)


def test_circuits_of_an_unfolded_model_are_those_of_its_folded_form():
    raw = qkov.from_hf(hf_model().double(), fold=False)
    folded = fold(raw).model
    for circuit in (qkov.full_ov_circuit, qkov.full_qk_circuit, qkov.ov_circuit, qkov.qk_circuit):
        torch.testing.assert_close(circuit(raw).AB, circuit(folded).AB, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        qkov.composition_scores(raw, "K"), qkov.composition_scores(folded, "K"), equal_nan=True
    )
    # and the folded circuits carry LayerNorm's weight: not the raw weights' product
    plain = raw.W_E @ raw.blocks[0].attn.W_V[0] @ raw.blocks[0].attn.W_O[0] @ raw.W_U
    difference = (qkov.full_ov_circuit(raw).AB[0, 0] - plain).abs().max()
    assert difference > 0.1 * plain.abs().max()
