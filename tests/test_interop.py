"""``qkov import`` and :func:`qkov.interop.import_checkpoint` (the package's own code): Hugging Face
and TransformerLens folders by command, loaded as ordinary checkpoints; folding's note on the
command line; and every bad folder one clear line, exit status 2 and nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import qkov
from qkov.cli import main
from qkov.interop import folder_kind, save_transformer_lens

from interop_models import FP32_TOLERANCE, TOKENS, gpt2_folder, tl_model


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
            lambda: (hf(), rewrite_config(folder, model_type="bloom")),
            "model_type 'bloom' is not supported .qkov reads gpt2, gemma, ",
        ),
        "llama keys missing": (
            lambda: (hf(), rewrite_config(folder, model_type="llama")),
            "missing field num_hidden_layers",
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
            "unexpected tensor W_pos",
        ),
        "gqa": (
            lambda: (tlf(), rewrite_config(folder, n_key_value_heads=1)),
            "missing tensor blocks.0.attn._W_K",
        ),
        "alibi": (
            lambda: (tlf(), rewrite_config(folder, positional_embedding_type="alibi")),
            "positional_embedding_type='alibi'",
        ),
        "rms": (
            lambda: (tlf(), rewrite_config(folder, normalization_type="RMS")),
            "unexpected tensor blocks.0.ln1.b",
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
        "no folder": (lambda: None, "no such file or folder"),
    }
    return cases[kind]


BAD = [
    *("corrupt pickle", "corrupt", "truncated", "shapes", "nan", "missing", "llama", "llama keys missing"),
    *("activation", "no config", "bad json", "unknown kind", "rotary", "gqa", "alibi", "rms"),
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


def test_folder_kind_tells_the_sources_apart_by_their_config(tmp_path):
    gpt2_folder(tmp_path / "gpt2", tokenizer=False)
    save_transformer_lens(tl_model(True), tmp_path / "tl")
    qkov.save(qkov.from_hf(tmp_path / "gpt2"), tmp_path / "qkov")
    assert folder_kind(tmp_path / "gpt2") == "huggingface"
    assert folder_kind(tmp_path / "tl") == "transformer_lens"
    assert folder_kind(tmp_path / "gpt2" / "model.safetensors", tmp_path / "tl" / "config.json") == (
        "transformer_lens"
    )  # the config given, not the one beside the weights
    with pytest.raises(qkov.QkovError, match=r"qkov: already a qkov checkpoint \(nothing to import\)$"):
        folder_kind(tmp_path / "qkov")


def test_import_checkpoint_refuses_its_own_source_and_a_config_with_a_mapping(tmp_path):
    gpt2_folder(tmp_path / "gpt2", tokenizer=False)
    with pytest.raises(qkov.QkovError, match="the output folder must differ from the source folder"):
        qkov.interop.import_checkpoint(tmp_path / "gpt2", tmp_path / "gpt2")
    with pytest.raises(qkov.QkovError, match=r"^give a config or a mapping, not both"):
        qkov.interop.import_checkpoint(tmp_path / "gpt2", tmp_path / "out", config="c.json", mapping="m.json")
    assert not (tmp_path / "out").exists()
