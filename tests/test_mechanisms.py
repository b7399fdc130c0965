"""Which induction mechanism: the hand-built K-composition induction head and the hand-built
pointer-arithmetic one (the paper's companion exercises) are classified as planted, behind
LayerNorm too; the grouping and the thresholds of the rule; and the registered step."""

from __future__ import annotations

import pytest
import torch
from pydantic import TypeAdapter

import qkov
from qkov.analyze import run_steps
from qkov.circuits.mechanisms import MECHANISM_SHARE, classify, induction_mechanisms, term_group
from qkov.data.random_tokens import repeated_random_tokens

from handbuilt import induction_model, pointer_arithmetic_model, with_layer_norm

PERIOD = 4


def repeated(model, seed: int = 0) -> torch.Tensor:
    return repeated_random_tokens(8, PERIOD, 3, model.cfg.d_vocab, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_k_composition_induction_head_is_classified_k_composition(layer_norm):
    model = induction_model().double()
    model = with_layer_norm(model).double() if layer_norm else model
    (row,) = qkov.induction_mechanisms(model, repeated(model), PERIOD, ["L1H0"])
    assert row.mechanism == "k_composition" and row.writer == "L0H0"
    assert qkov.induction_mechanisms(model, repeated(model), PERIOD, "L1H0") == [row]  # one name, one head
    # the rest is mostly the planted recency term (embed x pos_embed), which favours the latest sources
    assert row.shares["k_composition"] > 0.85 and abs(row.shares["pointer"]) < 1e-4
    assert sum(row.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert (row.top_terms[0].query, row.top_terms[0].key) == ("embed", "L0H0")
    if not layer_norm:  # 100 at the target, against the recency term's 12 per position
        assert row.margin > 90


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_pointer_arithmetic_induction_head_is_classified_pointer(layer_norm):
    model = pointer_arithmetic_model().double()
    model = with_layer_norm(model).double() if layer_norm else model
    (row,) = qkov.induction_mechanisms(model, repeated(model), PERIOD, ["L1H0"])
    assert row.mechanism == "pointer"
    assert row.shares["pointer"] == pytest.approx(1.0, abs=1e-3)
    assert abs(row.shares["k_composition"]) < 1e-3
    assert (row.top_terms[0].query, row.top_terms[0].key) == ("L0H0.pos", "pos_embed")


def test_the_groups():
    assert term_group("embed", "L0H3") == "k_composition"
    for query, key in [("L0H0.pos", "pos_embed"), ("pos_embed", "L0H1.pos"), ("L0H0.pos", "L1H2.pos")]:
        assert term_group(query, key) == "pointer"
    others = [
        ("pos_embed", "pos_embed"),  # a fixed offset preference, not a pointer
        ("embed", "embed"),
        ("embed", "pos_embed"),
        ("embed", "L0H3.pos"),
        ("L0H3", "embed"),
        ("L0H3", "L0H3"),
        ("embed", "L0MLP"),
        ("embed", "L0H3.mlp"),
        ("embed", "L0H3.bias"),
        ("bias", "L0H3"),
    ]
    for query, key in others:
        assert term_group(query, key) == "other", (query, key)


def test_the_rule_thresholds():
    assert classify({"k_composition": MECHANISM_SHARE, "pointer": 0.3, "other": 0.2}, 1.0) == "k_composition"
    assert classify({"k_composition": 0.49, "pointer": 0.3, "other": 0.21}, 1.0) == "other"
    assert classify({"k_composition": 0.6, "pointer": 0.7, "other": -0.3}, 1.0) == "pointer"
    assert classify({"k_composition": 0.2, "pointer": 0.2, "other": 0.6}, 1.0) == "other"
    assert classify({"k_composition": 0.9, "pointer": 0.0, "other": 0.1}, -1.0) == "other"
    assert classify({"k_composition": 0.9, "pointer": 0.0, "other": 0.1}, 0.0) == "other"


def test_a_zero_margin_has_undefined_shares():
    """A head whose queries and keys are zero scores every source alike: its margin is 0 and its
    shares null, as results.json holds an undefined number."""
    model = induction_model().double()
    with torch.no_grad():
        model.blocks[1].attn.W_Q[1].zero_()
    (row,) = induction_mechanisms(model, repeated(model), PERIOD, ["L1H1"])
    assert row.margin == 0 and row.mechanism == "other"
    assert all(share is None for share in row.shares.values())


def test_the_step_classifies_every_induction_head_and_round_trips():
    torch.manual_seed(0)
    done = run_steps(induction_model(), ["induction_mechanism"])
    assert done["repeated_tokens"].induction_heads == ["L1H0"]
    (row,) = done["induction_mechanism"]
    assert (row.head, row.mechanism, row.writer) == ("L1H0", "k_composition", "L0H0")
    assert row.tokens == "repeated random tokens" and row.period == 4  # n_ctx 12 // 3
    adapter, rows = TypeAdapter(list[qkov.InductionMechanism]), done["induction_mechanism"]
    assert adapter.validate_json(adapter.dump_json(rows)) == rows
