"""Hugging Face GPT-2 in (``qkov.interop.hf``): the logits of ``GPT2LMHeadModel`` itself, unfolded
and folded, for every activation, in float32 and float64; a folder's pickled weights and an untied
``lm_head``; and the imported model through save, load and ``double()``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov

from interop_models import FP32_TOLERANCE, FP64_TOLERANCE, TOKENS, centred, gpt2_folder, hf_model


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


def test_imported_model_survives_save_load_and_double(tmp_path):
    model = qkov.from_hf(hf_model())
    qkov.save(model, tmp_path)
    loaded = qkov.load(tmp_path)
    assert loaded.cfg == model.cfg
    np.testing.assert_array_equal(loaded(TOKENS).detach().numpy(), model(TOKENS).detach().numpy())
    torch.testing.assert_close(loaded.double()(TOKENS).float(), model(TOKENS), rtol=0, atol=FP32_TOLERANCE)
