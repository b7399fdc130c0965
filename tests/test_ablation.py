"""Ablating a head: its write replaced by zero or by its mean, and what breaks downstream."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.circuits.ablation import ablation_effects, run_ablated
from qkov.data.random_tokens import repeated_random_tokens

from handbuilt import induction_model


def test_ablating_the_previous_token_head_breaks_induction():
    model = induction_model()
    tokens = repeated_random_tokens(8, 4, 3, 64, torch.Generator().manual_seed(0))
    effects = {(e.head, e.mode): e for e in ablation_effects(model, tokens, period=4)}
    assert set(effects) == {(h, m) for h in ("L0H0", "L0H1") for m in ("zero", "mean")}
    for mode in ("zero", "mean"):
        broken = effects[("L0H0", mode)]
        assert broken.induction_change["L1H0"] < -0.8
        assert broken.loss_change[1] > 2.0
        harmless = effects[("L0H1", mode)]
        assert abs(harmless.induction_change["L1H0"]) < 0.05


def test_a_given_clean_run_is_the_one_computed():
    model = induction_model()
    tokens = repeated_random_tokens(4, 4, 3, 64, torch.Generator().manual_seed(1))
    with torch.no_grad():
        clean = model.run_with_cache(tokens)
    assert ablation_effects(model, tokens, 4, clean_run=clean) == ablation_effects(model, tokens, 4)


def test_mean_ablation_writes_the_mean():
    model = induction_model()
    tokens = torch.randint(1, 64, (4, 12))
    _, clean = model.run_with_cache(tokens)
    _, ablated = run_ablated(model, tokens, 0, 0, "mean")
    mean = clean["blocks.0.attn.hook_result"][:, :, 0].mean((0, 1))
    torch.testing.assert_close(ablated["blocks.0.attn.hook_result"][:, :, 0], mean.expand(4, 12, -1))
    with pytest.raises(qkov.QkovError, match="'zero' or 'mean'"):
        run_ablated(model, tokens, 0, 0, "resample")
