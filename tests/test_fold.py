"""LayerNorm folding (``qkov.interop.fold``): TransformerLens' own folding tensor by tensor, the
log-probabilities kept, the model left as it was, shortformer positions kept unfolded and said so,
and the circuits of an unfolded model those of its folded form."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.interop import fold, to_hooked_transformer, to_transformer_lens

from conftest import random_model
from interop_models import FP32_TOLERANCE, TOKENS, hf_model, tl_model


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


def test_the_folded_weights_are_centred_and_the_log_probs_kept_in_float64():
    """Known answers of the four steps on a random LayerNorm model with MLPs and biases: every
    writing weight has mean zero over ``d_model``, ``W_U`` and ``b_U`` mean zero over the
    vocabulary, ``b_V`` is zero, and the log-probabilities are those of the model (float64)."""
    cfg = qkov.Config(2, 3, 12, 4, 17, 9, positional_embedding="standard", normalization="LN", d_mlp=10)
    model = random_model(cfg, biases=True).double()
    folded = fold(model).model
    assert folded.cfg.normalization == "LNPre"
    writers = [folded.W_E, folded.W_pos]
    for block in folded.blocks:
        writers += [block.attn.W_O, block.attn.b_O, block.mlp.W_out, block.mlp.b_out]
        assert torch.equal(block.attn.b_V, torch.zeros_like(block.attn.b_V))
    for W in writers:
        torch.testing.assert_close(W.mean(-1), torch.zeros_like(W.mean(-1)), rtol=0, atol=1e-14)
    for W in (folded.W_U, folded.b_U):
        torch.testing.assert_close(W.mean(-1), torch.zeros_like(W.mean(-1)), rtol=0, atol=1e-14)
    tokens = torch.randint(0, 17, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        folded(tokens).log_softmax(-1), model(tokens).log_softmax(-1), rtol=0, atol=1e-12
    )
