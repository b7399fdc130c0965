"""docs/from-transformerlens.md: every qkov call the page names exists and does what the page says,
on a small random model (and, where TransformerLens is installed, the round trip through it)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

import qkov
from qkov.circuits.ablation import ablation_effects, run_ablated
from qkov.data.random_tokens import repeated_random_tokens
from qkov.names import hook_name

from conftest import random_model

PAGE = Path(__file__).resolve().parent.parent / "docs" / "from-transformerlens.md"
CFG = qkov.Config(n_layers=2, n_heads=4, d_model=64, d_head=16, d_vocab=64, n_ctx=32)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=1).double().eval().requires_grad_(False)


def test_the_page_names_only_calls_that_exist():
    names = set(re.findall(r"`(qkov(?:\.\w+)+)\(", PAGE.read_text()))
    assert len(names) >= 15
    for dotted in names:
        target = qkov
        for part in dotted.split(".")[1:]:
            if not hasattr(target, part):
                import importlib

                target = importlib.import_module(f"{target.__name__}.{part}")
            else:
                target = getattr(target, part)
        assert callable(target), dotted


def test_running_and_caching_as_the_page_says(model):
    tokens = torch.randint(0, CFG.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(tokens)
    assert logits.shape == (2, 12, CFG.d_vocab)
    torch.testing.assert_close(logits, model(tokens))
    assert model.loss(tokens).ndim == 0
    assert cache["blocks.1.attn.hook_pattern"] is cache[hook_name(1, "pattern")]
    assert cache["blocks.0.attn.hook_result"].shape == (2, 12, CFG.n_heads, CFG.d_model)
    for hook in ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"):
        assert hook in cache
    zeroed = model.run_with_cache(tokens, edit_writes=lambda layer, w: w * (layer != 0))[1]
    assert zeroed["blocks.0.attn.hook_result"].abs().max() == 0
    frozen, _ = model.run_with_cache(tokens, patterns=qkov.frozen_patterns(model, tokens))
    torch.testing.assert_close(frozen, logits)


def test_weights_and_circuits_as_the_page_says(model):
    assert model.blocks[0].attn.W_Q.shape == (CFG.n_heads, CFG.d_model, CFG.d_head)
    assert qkov.ov_circuit(model).shape == (CFG.n_layers, CFG.n_heads, CFG.d_model, CFG.d_model)
    assert isinstance(qkov.qk_circuit(model), qkov.FactoredMatrix)
    full = qkov.full_ov_circuit(model)
    assert full.shape[-2:] == (CFG.d_vocab, CFG.d_vocab) and full.eigenvalues().shape[-1] <= CFG.d_head
    raw = qkov.composition_scores(model, "K", subtract_baseline=False)
    assert raw.shape == (2, 4, 2, 4) and raw[0, :, 0].isnan().all() and not raw[0, :, 1].isnan().any()
    folded = qkov.interop.fold(model).model
    assert isinstance(folded, qkov.Transformer)


def test_ablation_patching_and_views_as_the_page_says(model):
    tokens = repeated_random_tokens(3, 5, 3, CFG.d_vocab, torch.Generator().manual_seed(1))
    for mode in ("mean", "batch-mean", "zero"):
        logits, _ = run_ablated(model, tokens, 0, 1, mode)
        assert logits.shape == (3, 15, CFG.d_vocab)
    assert len(ablation_effects(model, tokens, 5)) == 2 * CFG.n_heads
    clean, estimates = qkov.attribution_patching(model, tokens, lambda logits: logits[:, -1, 0].sum())
    assert estimates.shape == (2, CFG.n_layers, CFG.n_heads)
    assert qkov.path_expansion(model, tokens) is not None
    _, cache = model.run_with_cache(tokens)
    strings = [f"t{int(t)}" for t in tokens[0]]
    view = qkov.view.attention(strings, [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(2)])
    html = view._repr_html_()
    assert "L1H3" in html and "t" + str(int(tokens[0, 0])) in html
    assert "L1H0" in qkov.view.heads(model)._repr_html_()


def test_a_model_goes_to_transformer_lens_and_back(model):
    pytest.importorskip("transformer_lens")
    double = copy.deepcopy(model).double()
    hooked = qkov.interop.to_hooked_transformer(double)
    tokens = torch.randint(0, CFG.d_vocab, (2, 10), generator=torch.Generator().manual_seed(2))
    back = qkov.from_transformer_lens(hooked, fold=False)
    torch.testing.assert_close(back.double()(tokens), double(tokens))
    torch.testing.assert_close(hooked(tokens).double(), double(tokens))
