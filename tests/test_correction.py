"""The corrected composition picture: the hand-built several-recent-tokens head is found with its
window, a previous-token head is not; each earlier head's key and query shares of an induction
head's margin match a dense float64 computation from the model's own cache; the minimal circuit's
losses and share match a dense float64 rebuild of the naive hypothesis; and the registered step."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import TypeAdapter

from qkov.analyze import run_steps
from qkov.circuits.attribution import score_parts
from qkov.circuits.correction import Correction, correction, minimal_circuit, recent_head, writer_shares
from qkov.circuits.paths import freeze
from qkov.data.random_tokens import repeated_random_tokens
from qkov.loss import token_losses
from qkov.names import hook_name

from conftest import float64_model
from handbuilt import induction_model, with_recent_head

PERIOD = 4


def repeated(model, period: int = PERIOD, seed: int = 0) -> torch.Tensor:
    return repeated_random_tokens(8, period, 3, model.cfg.d_vocab, torch.Generator().manual_seed(seed))


def centred_share(term: torch.Tensor, total: torch.Tensor) -> float:
    """The variance share by a loop over rows: each row's ``src <= dest`` centred on its mean."""
    num = den = 0.0
    term, total = term.detach(), total.detach()
    for b in range(total.shape[0]):
        for dest in range(total.shape[1]):
            t, s = term[b, dest, : dest + 1], total[b, dest, : dest + 1]
            t, s = t - t.mean(), s - s.mean()
            num, den = num + float(t @ s), den + float(s @ s)
    return num / den


@pytest.mark.parametrize("window", [3, 5])
def test_the_hand_built_recent_head_is_found_with_its_window(window):
    model = with_recent_head(induction_model(), window).double()
    found = correction(model, repeated(model), PERIOD, ["L1H0"], ["L0H0"])
    assert correction(model, repeated(model), PERIOD, "L1H0", "L0H0") == found  # one name, one head
    by_name = {h.head: h for h in found.heads}
    recent = by_name["L0H1"]
    assert recent.recent and recent.window == window
    assert recent.offsets[:window] == pytest.approx([1 / window] * window, abs=1e-4)
    assert recent.key_position_share == pytest.approx(1.0, abs=1e-12)  # its scores are pos x pos only
    previous = by_name["L0H0"]  # one offset holds all its attention: a previous-token head, not recent
    assert previous.window == 2 and previous.offsets[1] == pytest.approx(1.0) and not previous.recent
    assert found.recent_heads == ["L0H1"]


def test_the_key_position_share_is_the_dense_variance_share():
    model = float64_model(1, "standard")
    tokens = repeated(model, 3)
    frozen = freeze(model, tokens)
    head = recent_head(score_parts(model, tokens, "L0H1", frozen), frozen.patterns[0][:, 1], 0)
    attn = model.blocks[0].attn
    x = model.W_E[tokens] + model.W_pos[: tokens.shape[1]]
    q = x @ attn.W_Q[1] / math.sqrt(model.cfg.d_head)
    total, positional = q @ (x @ attn.W_K[1]).mT, q @ (model.W_pos[: tokens.shape[1]] @ attn.W_K[1]).mT
    assert head.key_position_share == pytest.approx(centred_share(positional, total), abs=1e-12)


@pytest.mark.parametrize("biases", [False, True])
@torch.no_grad()
def test_writer_shares_are_the_dense_margin_split(biases):
    model = float64_model(2, "standard", biases=biases)
    tokens = repeated(model, 3)
    period, reader = 3, 1
    parts = score_parts(model, tokens, f"L1H{reader}")
    earlier = ["L0H0", "L0H1", "L0H2"]
    shares = writer_shares(parts, period, earlier, ["L0H0"])
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[1].attn
    scale = model.cfg.d_head**-0.5
    b_Q = 0.0 if attn.b_Q is None else attn.b_Q[reader]
    b_K = 0.0 if attn.b_K is None else attn.b_K[reader]
    q = (cache[hook_name(1, "resid_pre")] @ attn.W_Q[reader] + b_Q) * scale
    k = cache[hook_name(1, "resid_pre")] @ attn.W_K[reader] + b_K
    writes = cache[hook_name(0, "result")]

    def margin(queries, keys) -> float:  # mean over the batch and dest >= period
        total = 0.0
        for dest in range(period, tokens.shape[1]):
            target = dest - period + 1
            others = [s for s in range(dest + 1) if s != target]
            total += float((queries[:, dest] * (keys[:, target] - keys[:, others].mean(1))).sum(-1).mean())
        return total / (tokens.shape[1] - period)

    whole = margin(q, k)
    for w, head in enumerate(earlier):
        key_ref = margin(q, writes[:, :, w] @ attn.W_K[reader]) / whole
        query_ref = margin(writes[:, :, w] @ attn.W_Q[reader] * scale, k) / whole
        assert shares.key[head] == pytest.approx(key_ref, abs=1e-10)
        assert shares.query[head] == pytest.approx(query_ref, abs=1e-10)
    assert shares.previous_token == shares.key["L0H0"]
    assert shares.beyond_previous == pytest.approx(shares.key["L0H1"] + shares.key["L0H2"], abs=1e-15)


def test_the_minimal_circuit_is_the_dense_naive_hypothesis():
    model = with_recent_head(induction_model()).double().requires_grad_(False)
    tokens = repeated(model)
    found = minimal_circuit(model, tokens, PERIOD, ["L1H0"], ["L0H0"])
    _, cache = model.run_with_cache(tokens)
    a1 = model.blocks[1].attn
    embed = model.W_E[tokens]
    q = embed @ a1.W_Q[0] / math.sqrt(model.cfg.d_head)
    k = cache[hook_name(0, "result")][:, :, 0] @ a1.W_K[0]
    n = tokens.shape[1]
    scores = (q @ k.mT).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    write = scores.softmax(-1) @ embed @ a1.W_V[0] @ a1.W_O[0]
    final = cache[hook_name(1, "resid_post")]
    own = cache[hook_name(1, "result")][:, :, 0]

    def loss(resid) -> float:  # no LayerNorm, no biases: the logits are resid @ W_U
        return float(token_losses((resid @ model.W_U)[:, :-1], tokens[:, 1:])[:, PERIOD:].mean())

    full, without, kept = loss(final), loss(final - own), loss(final - own + write)
    assert found.loss_full == pytest.approx(full, abs=1e-10)
    assert found.loss_without == pytest.approx(without, abs=1e-10)
    assert found.loss_minimal == pytest.approx(kept, abs=1e-10)
    assert found.share == pytest.approx((without - kept) / (without - full), abs=1e-9)
    # the planted circuit is the naive hypothesis plus a recency preference that blurs the target,
    # so the minimal circuit predicts better than the head itself
    assert found.share > 1 and found.previous_token_heads == ["L0H0"]


def test_no_previous_token_head_no_minimal_circuit():
    model = induction_model().double()
    assert minimal_circuit(model, repeated(model), PERIOD, ["L1H0"], []) is None
    assert minimal_circuit(model, repeated(model), PERIOD, ["L1H0"], ["L1H1"]) is None  # not earlier


def test_the_step_fills_the_field_and_round_trips():
    model = with_recent_head(induction_model(n_ctx=16)).double()
    done = run_steps(model, ["correction"])
    found = done["correction"]
    assert "L0H1" in found.recent_heads
    assert [w.head for w in found.writers] == done["repeated_tokens"].induction_heads
    assert found.minimal is not None and found.minimal.previous_token_heads == ["L0H0"]
    adapter = TypeAdapter(Correction)
    assert adapter.validate_json(adapter.dump_json(found)) == found
