"""TransformerLens 3.x both ways (``qkov.interop.transformer_lens``): a ``HookedTransformer``'s logits,
attention-only or with MLPs, unfolded and folded, in float32 and float64, and back out as a
``HookedTransformer``; a saved folder imports as the model it was saved from."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.interop import save_transformer_lens, to_hooked_transformer, to_transformer_lens

from interop_models import FP32_TOLERANCE, FP64_TOLERANCE, TOKENS, centred, tl_model


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


@pytest.mark.parametrize("attn_only", [True, False])
def test_a_saved_folder_imports_as_the_model_it_was_saved_from(tmp_path, attn_only):
    hooked = tl_model(attn_only).to(torch.float64)
    save_transformer_lens(hooked, tmp_path / "tl")
    from_folder = qkov.from_transformer_lens(tmp_path / "tl", fold=False)
    from_object = qkov.from_transformer_lens(hooked, fold=False)
    assert from_folder.cfg == from_object.cfg
    ours, theirs = to_transformer_lens(from_folder), to_transformer_lens(from_object)
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name  # the same numbers, bit for bit
    torch.testing.assert_close(from_folder(TOKENS), hooked(TOKENS).detach(), rtol=0, atol=FP64_TOLERANCE)
