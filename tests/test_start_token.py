"""A start token (``Config.bos_token_id``): the repeated-token test reads ``[BOS]`` then the repeats,
as the paper's own induction test begins with ``<START>``, and its scores and losses, read on the
positions after the start token, are those computed by hand there; corpus windows begin with it;
``qkov import`` records it (``--bos-token-id``, or a Hugging Face config's ``bos_token_id``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import qkov
from qkov.analyze import analyze
from qkov.circuits.ablation import ablation_effects, run_ablated
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.cli import main
from qkov.context import REPEATS, Context
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens
from qkov.data.tokens import TokenSplits

from conftest import random_model

CFG = qkov.Config(
    n_layers=2, n_heads=2, d_model=16, d_head=4, d_vocab=11, n_ctx=13, positional_embedding="standard"
)
BOS = 10


def test_repeats_begin_with_the_start_token_which_is_never_drawn():
    tokens = repeated_random_tokens(64, 4, 3, 11, torch.Generator().manual_seed(0), bos_token_id=BOS)
    assert tokens.shape == (64, 13) and (tokens[:, 0] == BOS).all()
    body = tokens[:, 1:]
    assert (body != BOS).all() and (body != 0).all() and set(body.unique().tolist()) == set(range(1, 10))
    assert torch.equal(body[:, :4], body[:, 4:8]) and torch.equal(body[:, :4], body[:, 8:])
    plain = repeated_random_tokens(64, 4, 3, 11, torch.Generator().manual_seed(0))
    assert torch.equal(plain, repeated_random_tokens(64, 4, 3, 11, torch.Generator().manual_seed(0), None))
    zero = repeated_random_tokens(64, 4, 3, 11, torch.Generator().manual_seed(0), bos_token_id=0)
    assert torch.equal(zero[:, 1:], plain)  # token 0 is never drawn anyway: the same draws


def by_hand(patterns: np.ndarray, offset: int, first: int) -> np.ndarray:
    """Mean attention from each position ``dest >= first`` of the repeats (position 1 + dest of the
    sequence) to ``dest - offset``, ``[n_heads]``, from one layer's ``[batch, head, pos, pos]``."""
    n = patterns.shape[-1] - 1
    values = [patterns[:, :, 1 + d, 1 + d - offset] for d in range(first, n)]
    return np.mean(values, axis=(0, 1))


def test_scores_with_a_start_token_are_those_of_the_positions_after_it():
    model = random_model(dataclasses.replace(CFG, bos_token_id=BOS), seed=2).double()
    period = 4
    tokens = repeated_random_tokens(5, period, 3, 11, torch.Generator().manual_seed(1), bos_token_id=BOS)
    result = repeated_token_behaviour(model, tokens, period, 3, bos_token_id=BOS)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    for layer in range(2):
        p = cache[f"blocks.{layer}.attn.hook_pattern"].numpy()
        heads = [h for h in result.heads if h.layer == layer]
        np.testing.assert_allclose([h.previous_token_score for h in heads], by_hand(p, 1, 1), rtol=1e-12)
        np.testing.assert_allclose(
            [h.induction_score for h in heads], by_hand(p, period - 1, period), rtol=1e-12
        )
        np.testing.assert_allclose(
            [h.duplicate_token_score for h in heads], by_hand(p, period, period), rtol=1e-12
        )
    log_probs = logits.log_softmax(-1).numpy()
    # repeat r: predicting tokens 1 + r * period + 1 ... 1 + (r + 1) * period - 1, from the position before
    for r, loss in enumerate(result.loss_per_repeat):
        targets = range(1 + r * period + 1, 1 + (r + 1) * period)
        nll = [-log_probs[b, t - 1, tokens[b, t]] for b in range(5) for t in targets]
        assert loss == pytest.approx(np.mean(nll), rel=1e-12)
    assert result.bos_token_id == BOS and len(result.loss_per_repeat) == 3


def test_ablations_with_a_start_token_read_the_positions_after_it():
    model = random_model(dataclasses.replace(CFG, bos_token_id=BOS), seed=3).double()
    tokens = repeated_random_tokens(4, 4, 3, 11, torch.Generator().manual_seed(1), bos_token_id=BOS)
    effects = ablation_effects(model, tokens, 4, start=1)
    clean = repeated_token_behaviour(model, tokens, 4, 3, bos_token_id=BOS)
    for effect in effects:
        layer, head = int(effect.head[1]), int(effect.head[3])
        logits, cache = run_ablated(model, tokens, layer, head, effect.mode)
        losses = torch.nn.functional.cross_entropy(
            logits[:, 1:-1].transpose(1, 2), tokens[:, 2:], reduction="none"
        )
        np.testing.assert_allclose(effect.loss_per_repeat, loss_per_repeat(losses, 4), rtol=1e-10)
        np.testing.assert_allclose(
            effect.loss_change, np.subtract(effect.loss_per_repeat, clean.loss_per_repeat), rtol=1e-10
        )
        induction = by_hand(cache["blocks.1.attn.hook_pattern"].numpy(), 3, 4)
        before = {h.name: h.induction_score for h in clean.heads}
        assert effect.induction_change["L1H0"] == pytest.approx(induction[0] - before["L1H0"], rel=1e-9)
        assert effect.start == 1


def test_the_context_puts_the_start_token_first_everywhere():
    model = random_model(dataclasses.replace(CFG, bos_token_id=BOS))
    rng = np.random.default_rng(0)
    corpus = TokenSplits(rng.integers(0, 10, 500), rng.integers(0, 10, 200))
    ctx = Context.of(model, corpus, 0, {})
    assert ctx.start == 1 and ctx.period == (13 - 1) // REPEATS
    for batch in (ctx.repeated, ctx.example[None], ctx.text, ctx.snippet[None]):
        assert (batch[:, 0] == BOS).all() and batch.shape[1] <= 13
    assert ctx.repeated.shape[1] == 13 and ctx.text.shape[1] == 13
    plain = Context.of(random_model(CFG), corpus, 0, {})
    assert plain.start == 0 and plain.period == 13 // REPEATS and (plain.repeated[:, 0] != BOS).any()
    results = analyze(model, corpus, show_progress=False)
    assert results.repeated_tokens.bos_token_id == BOS
    assert results.term_importance.tokens == "corpus (eval split) after the start token"
    assert "after the start token" in results.attention_examples.repeated.description


def test_import_records_the_start_token(tmp_path):
    pytest.importorskip("transformer_lens")
    from qkov.interop import save_transformer_lens, to_hooked_transformer

    save_transformer_lens(to_hooked_transformer(random_model(CFG)), tmp_path / "tl")
    main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "a"), "--bos-token-id", "10"])
    assert qkov.load(tmp_path / "a").cfg.bos_token_id == BOS
    with pytest.raises(SystemExit):
        main(["import", str(tmp_path / "tl"), "--out", str(tmp_path / "b"), "--bos-token-id", "11"])
    assert not (tmp_path / "b").exists()


def test_a_hugging_face_bos_token_id_is_the_start_token_when_in_the_vocabulary():
    from qkov.interop.hf import hf_config

    data = {"n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 6, "vocab_size": 20}
    data |= {"activation_function": "gelu_new"}
    assert hf_config(data | {"bos_token_id": 3}, "test").bos_token_id == 3
    assert hf_config(data | {"bos_token_id": 50256}, "test").bos_token_id is None
    assert hf_config(data, "test").bos_token_id is None
