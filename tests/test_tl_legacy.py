"""TransformerLens-legacy folders (Neel Nanda's toy models: config.json in their own keys beside a
.pth state dict) and cfg.to_dict() folders with a .pth: log-probabilities equal TransformerLens'
(a HookedTransformer built from the same config and state dict) in float64."""

from __future__ import annotations

import json
import logging
import re
import warnings

import pytest
import torch

import qkov
from qkov.cli import main
from qkov.interop import save_transformer_lens

tl = pytest.importorskip("transformer_lens")
logging.getLogger("transformer_lens").setLevel(logging.ERROR)

FP64_TOLERANCE = 1e-10
TOKENS = torch.randint(0, 19, (3, 8), generator=torch.Generator().manual_seed(1))

# (normalization, shortformer_pos, attn_only): attention-only without and with LayerNorm,
# shortformer positions (LayerNorm kept unfolded there, and without it), and one with MLPs
KINDS = {
    "attn-only": (None, False, True),
    "attn-only LN": ("LN", False, True),
    "shortformer LN": ("LN", True, True),
    "shortformer": (None, True, True),
    "mlp LN": ("LN", False, False),
}


def legacy_config(normalization, shortformer, attn_only):
    """A config.json in the legacy keys, with training keys that describe no weight beside them."""
    return {
        "n_layers": 2, "d_model": 12, "d_mlp": 20, "d_head": 4, "n_heads": 3, "n_ctx": 8,
        "d_vocab": 19, "act_fn": "solu_ln" if attn_only else "gelu", "attn_only": attn_only,
        "normalization": normalization, "shortformer_pos": shortformer, "tokenizer_name": None,
        "lr_hidden": 0.002, "batch_size": 32, "seed": 7, "max_tokens": 1000, "version": 1,
    }  # fmt: skip


def hooked_from_documented_keys(config):
    """The HookedTransformer of a legacy config by TransformerLens' documented key mapping
    (convert_neel_model_config), every weight drawn, in float64."""
    cfg = tl.HookedTransformerConfig(
        **{k: config[k] for k in ("d_model", "n_layers", "d_head", "n_heads", "n_ctx", "d_vocab")},
        d_mlp=config["d_mlp"],
        act_fn=config["act_fn"],
        attn_only=config["attn_only"],
        normalization_type=config["normalization"],
        positional_embedding_type="shortformer" if config["shortformer_pos"] else "standard",
        device="cpu",
        dtype=torch.float64,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked = tl.HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in hooked.named_parameters():
            shift = 1.0 if name.endswith(".w") else 0.0
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64) * 0.3 + shift)
    return hooked


def legacy_folder(folder, kind, weights="model_final.pth"):
    config = legacy_config(*KINDS[kind])
    hooked = hooked_from_documented_keys(config)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(hooked.state_dict(), folder / weights)
    return hooked


def assert_same_log_probs(model, hooked):
    ours = model(TOKENS).log_softmax(-1)
    theirs = hooked(TOKENS).detach().log_softmax(-1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=FP64_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
def test_legacy_folder_imports_by_one_command(tmp_path, capsys, kind):
    hooked = legacy_folder(tmp_path / "neel", kind)
    main(["import", str(tmp_path / "neel"), "--out", str(tmp_path / "qkov")])
    err = capsys.readouterr().err
    model = qkov.load(tmp_path / "qkov")
    assert model.cfg.source == "transformer_lens" and model.W_E.dtype == torch.float64
    assert model.cfg.positional_embedding == ("shortformer" if "shortformer" in kind else "standard")
    assert model.cfg.has_mlp == ("mlp" in kind)
    assert ("note: LayerNorm kept unfolded" in err) == (kind == "shortformer LN")
    assert_same_log_probs(model, hooked)
    assert_same_log_probs(qkov.from_transformer_lens(tmp_path / "neel", fold=False), hooked)


def test_a_checkpoint_pth_imports_with_the_folder_config(tmp_path):
    """Neel's checkpoints lie in checkpoints/NAME_{N}.pth, their config.json one folder up."""
    legacy_folder(tmp_path / "neel", "attn-only LN")
    later = hooked_from_documented_keys(legacy_config(*KINDS["attn-only LN"]))
    with torch.no_grad():
        for param in later.parameters():
            param.mul_(1.5)
    (tmp_path / "neel" / "checkpoints").mkdir()
    torch.save(later.state_dict(), tmp_path / "neel" / "checkpoints" / "model_1000.pth")
    main([
        "import", str(tmp_path / "neel" / "checkpoints" / "model_1000.pth"),
        "--config", str(tmp_path / "neel" / "config.json"), "--out", str(tmp_path / "qkov"),
    ])  # fmt: skip
    assert_same_log_probs(qkov.load(tmp_path / "qkov"), later)


@pytest.mark.parametrize("kind", ["attn-only LN", "shortformer"])
def test_to_dict_folder_with_a_pth_imports(tmp_path, kind):
    hooked = hooked_from_documented_keys(legacy_config(*KINDS[kind]))
    save_transformer_lens(hooked, tmp_path / "tl")
    (tmp_path / "tl" / "model.safetensors").unlink()
    torch.save(hooked.state_dict(), tmp_path / "tl" / "model.pth")
    main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "qkov")])
    assert_same_log_probs(qkov.load(tmp_path / "qkov"), hooked)


def rewrite(folder, **changes):
    data = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps({k: v for k, v in data.items() if v != "DROP"}))


BAD = {
    "missing key": (lambda f: rewrite(f, d_head="DROP"), "missing field.s. d_head"),
    "missing attn_only": (lambda f: rewrite(f, attn_only="DROP"), "missing field.s. attn_only"),
    "old layout": (
        lambda f: rewrite(f, architecture="neel-solu-old"),
        "the 'neel-solu-old' weight layout is not supported .architecture.",
    ),
    "final rms": (lambda f: rewrite(f, final_rms=True), "final RMSNorm is not supported .final_rms=True."),
    "solu mlp": (lambda f: rewrite(f, attn_only=False), "activation 'solu_ln' is not supported"),
    "wrong shapes": (
        lambda f: rewrite(f, d_model=16),
        r"tensor W_E has shape \(19, 12\), config expects \(19, 16\)",
    ),
    "rms": (lambda f: rewrite(f, normalization="RMS"), "unexpected tensor blocks.0.ln1.b"),
}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_legacy_folder_gives_one_line(tmp_path, capsys, kind):
    legacy_folder(tmp_path / "neel", "attn-only LN")
    make, message = BAD[kind]
    make(tmp_path / "neel")
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(tmp_path / "neel"), "--out", str(tmp_path / "qkov")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkov: error: ") and "\n" not in err and re.search(message, err), err
    assert not (tmp_path / "qkov").exists()
