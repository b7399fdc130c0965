"""TransformerLens 4 (``TransformerBridge``) both ways, in float64 against qkov's own forward (which
tests/test_transformer_lens.py holds to TransformerLens 3.x, the oracle); each way refusing in one
line when the other version is installed; and TransformerLens folders read with no TransformerLens
at all.

`make test` runs this file twice: in .venv (TransformerLens 3.x) and in .venv-tl4 (4.x)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import qkov
from qkov.cli import main
from qkov.interop import (
    save_transformer_lens,
    to_hooked_transformer,
    to_transformer_bridge,
    to_transformer_lens,
)
from qkov.interop.transformer_bridge import installed_transformer_lens

from conftest import random_model
from tl_folder import transformer_lens_folder

TL_MAJOR = int(installed_transformer_lens().split(".")[0]) if installed_transformer_lens() else None
tl4 = pytest.mark.skipif(TL_MAJOR != 4, reason="needs TransformerLens 4.x (the .venv-tl4 run)")
tl3 = pytest.mark.skipif(TL_MAJOR != 3, reason="needs TransformerLens 3.x (the .venv run)")

FP64_TOLERANCE = 1e-10
FP32_TOLERANCE = 1e-4  # relative to the largest logit (tens without LayerNorm)
TOKENS = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(5))


def qkov_model(normalization="LN", d_mlp=0, positions="standard", dtype=torch.float64, seed=0):
    cfg = qkov.Config(
        n_layers=2, d_model=12, n_heads=3, d_head=4, d_vocab=23, n_ctx=9, d_mlp=d_mlp,
        normalization=normalization, positional_embedding=positions,
    )  # fmt: skip
    return random_model(cfg, seed=seed, biases=True).to(dtype)


def log_probs(logits):
    return logits.detach().log_softmax(-1)


# --- folders need no TransformerLens --------------------------------------------------------------


BLOCKED = "import sys; sys.modules['transformer_lens'] = None; from qkov.cli import main; main(sys.argv[1:])"


@pytest.mark.parametrize("d_mlp", [0, 20])
def test_folder_imports_with_transformer_lens_unimportable(tmp_path, d_mlp):
    """`import transformer_lens` raises in the child process, so any use of it would fail the import."""
    model = qkov_model(d_mlp=d_mlp, positions="shortformer")
    transformer_lens_folder(tmp_path / "tl", model)
    args = ["import", str(tmp_path / "tl"), "--out", str(tmp_path / "qkov")]
    done = subprocess.run([sys.executable, "-c", BLOCKED, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = qkov.load(tmp_path / "qkov")
    assert imported.cfg.source == "transformer_lens" and imported.W_E.dtype == torch.float64
    torch.testing.assert_close(
        log_probs(imported(TOKENS)), log_probs(model(TOKENS)), rtol=0, atol=FP64_TOLERANCE
    )


# --- TransformerLens 3.x: the bridge way out says what it needs -----------------------------------


@tl3
def test_to_transformer_bridge_refuses_transformer_lens_3_in_one_line():
    with pytest.raises(qkov.QkovError) as err:
        to_transformer_bridge(qkov_model())
    message = str(err.value)
    assert "\n" not in message and "TransformerLens 4.x" in message
    assert installed_transformer_lens() in message
    assert "to_hooked_transformer" in message and "transformer-lens>=4,<5" in message


# --- TransformerLens 4.x: out through boot_native, in from any bridge -----------------------------


@tl4
@pytest.mark.parametrize("normalization", ["LN", "LNPre", "none"])
@pytest.mark.parametrize("d_mlp", [0, 20])
@pytest.mark.parametrize("positions", ["standard", "none"])
@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float64, FP64_TOLERANCE), (torch.float32, FP32_TOLERANCE)]
)
def test_bridge_runs_the_same_model(normalization, d_mlp, positions, dtype, tolerance):
    model = qkov_model(normalization, d_mlp, positions, dtype)
    bridge = to_transformer_bridge(model)
    assert type(bridge).__name__ == "TransformerBridge" and bridge.cfg.architecture == "TransformerLensNative"
    ours, cache = model.run_with_cache(TOKENS)
    theirs, bridge_cache = bridge.run_with_cache(TOKENS)
    assert theirs.dtype == dtype
    scale = ours.abs().max().clamp(min=1).item()
    torch.testing.assert_close(theirs.detach(), ours.detach(), rtol=0, atol=tolerance * scale)
    for layer in range(2):
        name = f"blocks.{layer}.attn.hook_pattern"
        torch.testing.assert_close(bridge_cache[name], cache[name], rtol=0, atol=tolerance)


@tl4
@pytest.mark.parametrize("d_mlp", [0, 20])
def test_round_trip_through_the_bridge_keeps_every_weight_exactly(d_mlp):
    model = qkov_model("LN", d_mlp)
    back = qkov.from_transformer_lens(to_transformer_bridge(model), fold=False)
    assert back.cfg.source == "transformer_lens" and back.cfg.has_mlp == bool(d_mlp)
    ours, theirs = to_transformer_lens(model), to_transformer_lens(back)
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def native_bridge(attn_only: bool, normalization="LN", positions="standard", seed=3):
    """A bridge TransformerLens builds and initialises itself (its own seeded init), in float64."""
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        n_layers=2, d_model=12, n_heads=3, d_head=4, d_vocab=23, n_ctx=9, attn_only=attn_only,
        d_mlp=None if attn_only else 20, act_fn="gelu_new", normalization_type=normalization,
        positional_embedding_type=positions, seed=seed, dtype=torch.float64,
    )  # fmt: skip
    bridge = TransformerBridge.boot_native(cfg, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # TransformerLens initialises norms to 1 and biases to 0: draw them too
        for param in bridge.parameters():
            param.add_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.1)
    return bridge


@tl4
@pytest.mark.parametrize("attn_only", [True, False])
def test_a_transformer_lens_bridge_imports_unfolded_and_folded(attn_only):
    bridge = native_bridge(attn_only)
    theirs = bridge(TOKENS).detach()
    model = qkov.from_transformer_lens(bridge, fold=False)
    assert model.cfg.normalization == "LN" and model.cfg.has_mlp == (not attn_only)
    torch.testing.assert_close(model(TOKENS), theirs, rtol=0, atol=FP64_TOLERANCE)
    folded = qkov.from_transformer_lens(bridge)
    assert folded.cfg.normalization == "LNPre"
    torch.testing.assert_close(log_probs(folded(TOKENS)), log_probs(theirs), rtol=0, atol=FP64_TOLERANCE)


@tl4
def test_a_bridge_in_compatibility_mode_imports_as_it_runs():
    """enable_compatibility_mode folds the bridge's LayerNorms into its weights (leaving unit norms)
    and centres them; what it then runs is what qkov imports. TransformerLens processes the weights
    in float32, so the bridge before and after agree only to float32 precision; qkov's import agrees
    with the processed bridge in float64."""
    bridge = native_bridge(attn_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge.enable_compatibility_mode()
    theirs = bridge(TOKENS).detach()
    model = qkov.from_transformer_lens(bridge, fold=False)
    torch.testing.assert_close(model(TOKENS), theirs, rtol=0, atol=FP64_TOLERANCE)


@tl4
@pytest.mark.parametrize("attn_only", [True, False])
def test_a_saved_bridge_imports_by_command(tmp_path, attn_only):
    bridge = native_bridge(attn_only)
    save_transformer_lens(bridge, tmp_path / "tl")
    main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "qkov")])
    model = qkov.load(tmp_path / "qkov")
    assert model.cfg.source == "transformer_lens" and model.cfg.normalization == "LNPre"
    torch.testing.assert_close(
        log_probs(model(TOKENS)), log_probs(bridge(TOKENS)), rtol=0, atol=FP64_TOLERANCE
    )


@tl4
def test_to_hooked_transformer_refuses_transformer_lens_4_in_one_line():
    with pytest.raises(qkov.QkovError) as err:
        to_hooked_transformer(qkov_model())
    message = str(err.value)
    assert "\n" not in message and "TransformerLens 3.x" in message
    assert installed_transformer_lens() in message
    assert "to_transformer_bridge" in message and "transformer-lens>=3,<4" in message


@tl4
def test_a_shortformer_model_is_refused_by_the_bridge_in_one_line():
    with pytest.raises(qkov.QkovError, match=r"^[^\n]*shortformer[^\n]*TransformerLens 3\.x$"):
        to_transformer_bridge(qkov_model(positions="shortformer"))


@tl4
@pytest.mark.parametrize(
    ("normalization", "positions", "says"),
    [("LN", "rotary", "these positions"), ("RMS", "standard", "this normalization")],
)
def test_a_bridge_qkov_cannot_run_is_refused_in_one_line(normalization, positions, says):
    bridge = native_bridge(attn_only=True, normalization=normalization, positions=positions)
    with pytest.raises(qkov.QkovError, match=rf"^TransformerBridge config: {says}[^\n]*$"):
        qkov.from_transformer_lens(bridge)
