"""Each claim's verdict follows its measurement by its rule, and every rule is stated in the claims page
of the documentation (docs/claims.md), every claim in the README's table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from qkov.analyze import analyze
from qkov.circuits.phase_change import phase_change
from qkov.claims import evaluate_claims, phase_change_claim, repeat_loss_claim
from qkov.results import Results

from golden import cases
from phase_logs import GRID, ONE_LAYER_LINEAR, log_of, logistic, two_layer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def models() -> dict[str, Results]:
    """Stand-ins for the three reproduce models: the seeded 0-layer model, the hand-built one-layer
    skip-trigram model and the hand-built induction model (their corpora are random tokens)."""
    picked = {"0-layer": "0-layer", "1-layer": "1-layer", "2-layer": "2-layer-induction"}
    built = cases()
    return {depth: analyze(*built[name], show_progress=False) for depth, name in picked.items()}


def with_repeats(r: Results, losses: list[float]) -> Results:
    return dataclasses.replace(
        r, repeated_tokens=dataclasses.replace(r.repeated_tokens, loss_per_repeat=losses)
    )


def test_the_hand_built_induction_model_passes_the_induction_claims(models):
    claims = {c.claim: c for c in evaluate_claims(models)}
    assert len(claims) == 9
    induction = next(c for name, c in claims.items() if name.startswith("Two layers"))
    assert induction.holds and "L0H0: previous-token score 1.00" in induction.measured
    assert next(c for name, c in claims.items() if name.startswith("Only K-composition")).holds


def test_the_repeat_loss_claim_follows_its_rule(models):
    one = models["1-layer"]
    drop = repeat_loss_claim(one, with_repeats(models["2-layer"], [8.0, 2.0, 1.5]))
    assert drop.holds is True and "8.00 / 2.00 / 1.50" in drop.measured
    assert repeat_loss_claim(one, with_repeats(models["2-layer"], [8.0, 7.9, 7.9])).holds is False
    assert "falls by more than 1.0 nat" in drop.rule


def test_the_phase_change_claim_follows_its_rule(models):
    def claim(two_layer_log, one_layer_log):
        change = phase_change(two_layer_log, one_layer_log)
        return phase_change_claim(dataclasses.replace(models["2-layer"], phase_change=change))

    holds = claim(two_layer(), ONE_LAYER_LINEAR)
    assert holds.holds and holds.holds == phase_change(two_layer(), ONE_LAYER_LINEAR).holds
    assert holds.measured == (
        "window 6.31M-15.8M tokens, 0.40 decades (best induction score 0.02 to 0.52); ICL 80% inside; "
        "bump: yes; 1-layer control: none (narrowest 50% window 1.50 decades)"
    )
    sharp_one_layer = log_of(icl_score=-logistic(GRID, 6.0, 0.4))
    assert "control: a window too (narrowest 50% window 0.20" in claim(two_layer(), sharp_one_layer).measured
    assert not claim(two_layer(), sharp_one_layer).holds
    assert not claim(two_layer(width=2.0), ONE_LAYER_LINEAR).holds
    assert not claim(two_layer(bump=0.0), ONE_LAYER_LINEAR).holds  # a straight loss has no bump
    assert "bump: no" in claim(two_layer(bump=0.0), ONE_LAYER_LINEAR).measured
    assert claim([], ONE_LAYER_LINEAR).measured == "no rise in the best induction score during training"
    assert "at most 0.7 decades" in holds.rule and "at least 50% of its change" in holds.rule


def test_every_rule_is_stated_in_the_docs_and_every_claim_in_the_readme(models):
    rules, readme = (ROOT / "docs" / "claims.md").read_text(), (ROOT / "README.md").read_text()
    for claim in evaluate_claims(models):
        assert claim.rule in rules, claim.rule
        assert f"| {claim.claim} |" in readme, claim.claim
    json.dumps([dataclasses.asdict(c) for c in evaluate_claims(models)])  # plain values only
