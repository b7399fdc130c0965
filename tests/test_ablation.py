"""Ablating a head: its write replaced by zero or by its mean, and what breaks downstream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov
from qkov.circuits import ablation, budget
from qkov.circuits.ablation import ablation_effects, clean_run, repeat_behaviour, run_ablated
from qkov.data.random_tokens import repeated_random_tokens
from qkov.interop.fold import fold

from conftest import float64_model, tokens_for
from handbuilt import induction_model
from reference import reference_forward


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
    clean = clean_run(model, tokens, 4)
    assert ablation_effects(model, tokens, 4, clean) == ablation_effects(model, tokens, 4)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)  # the run's behaviour, read off its whole logits
    assert clean.behaviour.induction == repeat_behaviour(logits, cache, tokens, 4).induction
    assert clean.behaviour.loss_per_repeat == pytest.approx(
        repeat_behaviour(logits, cache, tokens, 4).loss_per_repeat
    )


def test_mean_ablation_writes_the_mean():
    model = induction_model()
    tokens = torch.randint(1, 64, (4, 12))
    _, clean = model.run_with_cache(tokens)
    write = clean["blocks.0.attn.hook_result"][:, :, 0]
    _, ablated = run_ablated(model, tokens, 0, 0, "mean")  # per position: [pos, d_model]
    torch.testing.assert_close(ablated["blocks.0.attn.hook_result"][:, :, 0], write.mean(0).expand(4, 12, -1))
    _, ablated = run_ablated(model, tokens, 0, 0, "batch-mean")  # one vector
    torch.testing.assert_close(
        ablated["blocks.0.attn.hook_result"][:, :, 0], write.mean((0, 1)).expand(4, 12, -1)
    )
    with pytest.raises(
        qkov.QkovError, match="^ablation mode must be one of 'zero', 'mean', 'batch-mean', got"
    ):
        run_ablated(model, tokens, 0, 0, "resample")
    with pytest.raises(qkov.QkovError, match="got 'mean-ablation'"):
        ablation_effects(model, tokens, 4, modes=("zero", "mean-ablation"))


@pytest.mark.parametrize("mode", ["zero", "mean", "batch-mean"])
def test_each_ablation_is_the_fields_definition_in_float64(mode):
    """Against the plain float64 model with the head's write replaced by hand: zero removes the
    whole unfolded head (its value bias too); "mean" averages over the batch at each position, as
    TransformerLens users and the ARENA solutions do; "batch-mean" over batch and positions."""
    model = float64_model(
        n_layers=2, normalization="LN", d_mlp=8, biases=True, positional_embedding="standard"
    )
    weights = {name: p.detach().numpy() for name, p in model.state_dict().items()}
    assert np.abs(weights["blocks.0.attn.b_V"]).max() > 0.1  # a value bias to remove
    tokens = tokens_for(model, batch=4)
    _, _, writes, _ = reference_forward(weights, model.cfg, tokens.numpy())
    head = writes[0][:, :, 1]  # [batch, pos, d_model]
    by_hand = {"zero": np.zeros(head.shape[-1]), "mean": head.mean(0), "batch-mean": head.mean((0, 1))}
    expected, _, _, _ = reference_forward(weights, model.cfg, tokens.numpy(), replace={(0, 1): by_hand[mode]})
    logits, _ = run_ablated(model, tokens, 0, 1, mode)
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-10, atol=1e-10)
    if mode != "zero":  # the two means differ: positions see different averages
        other = "batch-mean" if mode == "mean" else "mean"
        assert (logits - run_ablated(model, tokens, 0, 1, other)[0]).abs().max() > 1e-3


def test_zero_ablation_of_a_folded_model_keeps_the_value_bias():
    """Why qkov ablates the model as given: folding moves b_V W_O into b_O, where zeroing the
    head's write leaves it (the write becomes the constant b_V W_O of the unfolded model)."""
    model = float64_model(n_layers=2, biases=True, positional_embedding="standard")
    folded = fold(model).model
    tokens = tokens_for(model, batch=3)
    unfolded_zero, _ = run_ablated(model, tokens, 0, 1, "zero")
    folded_zero, _ = run_ablated(folded, tokens, 0, 1, "zero")
    assert (unfolded_zero - folded_zero).abs().max() > 1e-3
    a = model.blocks[0].attn
    kept = (a.b_V[1] @ a.W_O[1]).detach()
    weights = {name: p.detach().numpy() for name, p in model.state_dict().items()}
    expected, _, _, _ = reference_forward(weights, model.cfg, tokens.numpy(), replace={(0, 1): kept.numpy()})
    log_probs = folded_zero.log_softmax(-1).numpy()  # folding centres the unembedding: logits shift
    expected = expected - np.log(np.exp(expected).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_probs, expected, rtol=1e-10, atol=1e-10)


@torch.no_grad()
def full_rerun_effects(model, tokens, period, modes=("zero", "mean")):
    """The definition, one full rerun per ablation (``run_ablated``): what ``ablation_effects``,
    which starts each run at the ablated layer and stacks them, must equal."""
    clean = repeat_behaviour(*model.run_with_cache(tokens), tokens, period)
    out = {}
    for layer in range(model.cfg.n_layers - 1):
        for head in range(model.cfg.n_heads):
            for mode in modes:
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
        # a norm after each sublayer: the reruns replace z, run_ablated the writes before that norm
        dict(n_layers=3, normalization="RMSPre", post_norms=True, d_mlp=8, biases=True),
    ],
)
@pytest.mark.parametrize("forward_tokens", [1, 4096])  # one ablation per forward, or all of a layer's
def test_ablations_equal_full_reruns_in_float64(kw, forward_tokens, monkeypatch):
    monkeypatch.setattr(ablation, "FORWARD_TOKENS", forward_tokens)
    model = float64_model(**kw, n_ctx=12)
    tokens = repeated_random_tokens(3, 4, 3, model.cfg.d_vocab, torch.Generator().manual_seed(2))
    modes = ("zero", "mean", "batch-mean")
    expected = full_rerun_effects(model, tokens, 4, modes)
    effects = ablation_effects(model, tokens, 4, modes=modes)
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
