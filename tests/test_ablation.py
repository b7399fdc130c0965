"""Ablating a head: its write replaced by zero or by its mean, and what breaks downstream."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.circuits import ablation, budget
from qkov.circuits.ablation import ablation_effects, repeat_behaviour, run_ablated
from qkov.data.random_tokens import repeated_random_tokens

from conftest import float64_model
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


@torch.no_grad()
def full_rerun_effects(model, tokens, period):
    """The definition, one full rerun per ablation (``run_ablated``): what ``ablation_effects``,
    which starts each run at the ablated layer and stacks them, must equal."""
    clean = repeat_behaviour(*model.run_with_cache(tokens), tokens, period)
    out = {}
    for layer in range(model.cfg.n_layers - 1):
        for head in range(model.cfg.n_heads):
            for mode in ("zero", "mean"):
                ablated = repeat_behaviour(*run_ablated(model, tokens, layer, head, mode), tokens, period)
                out[(f"L{layer}H{head}", mode)] = (
                    [
                        ablated.induction[later][h] - clean.induction[later][h]
                        for later in range(layer + 1, model.cfg.n_layers)
                        for h in range(model.cfg.n_heads)
                    ],
                    ablated.loss_per_repeat,
                )
    return out


@pytest.mark.parametrize(
    "kw",
    [
        dict(n_layers=3),
        dict(n_layers=3, normalization="LN", d_mlp=12, biases=True, positional_embedding="standard"),
        dict(n_layers=2, normalization="LNPre", d_mlp=8, act_fn="relu"),
    ],
)
@pytest.mark.parametrize("forward_tokens", [1, 4096])  # one ablation per forward, or all of a layer's
def test_ablations_equal_full_reruns_in_float64(kw, forward_tokens, monkeypatch):
    monkeypatch.setattr(ablation, "FORWARD_TOKENS", forward_tokens)
    model = float64_model(**kw, n_ctx=12)
    tokens = repeated_random_tokens(3, 4, 3, model.cfg.d_vocab, torch.Generator().manual_seed(2))
    expected = full_rerun_effects(model, tokens, 4)
    effects = ablation_effects(model, tokens, 4)
    assert [(e.head, e.mode) for e in effects] == list(expected)
    for e in effects:
        induction, losses = expected[(e.head, e.mode)]
        assert list(e.induction_change.values()) == pytest.approx(induction, abs=1e-12)
        assert e.loss_per_repeat == pytest.approx(losses, rel=1e-12)
    assert any(abs(x) > 1e-3 for e in effects for x in e.induction_change.values())  # not all trivially 0


def test_the_ablation_cost_counts_every_rerun():
    cfg = qkov.Config(n_layers=3, n_heads=2, d_model=16, d_head=4, d_vocab=50, n_ctx=12, d_mlp=8)
    layer, logits = budget.layer_flop(cfg, 9), budget.unembed_flop(cfg)
    clean = 3 * layer + logits
    reruns = 2 * 2 * ((3 + 2) * layer + 2 * logits)  # modes x heads x (layers 0 and 1 on, with logits)
    assert ablation.ablation_flop(cfg, 9) == clean + reruns
