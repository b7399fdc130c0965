"""Each claim's verdict follows its measurement by its rule, and every rule is in the README."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from qkov.analyze import analyze
from qkov.circuits.phase_change import PhaseChange
from qkov.claims import evaluate_claims, phase_change_claim, repeat_loss_claim
from qkov.results import Results

from golden import cases

README = Path(__file__).resolve().parent.parent / "README.md"


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
    def change(width: float) -> Results:
        return dataclasses.replace(
            models["2-layer"], phase_change=PhaseChange(1e6, 2e6, width, 1.5e6, 0.0, 0.4)
        )

    assert phase_change_claim(change(0.2)).holds and not phase_change_claim(change(0.3)).holds
    assert not phase_change_claim(dataclasses.replace(models["2-layer"], phase_change=None)).holds


def test_every_rule_is_stated_in_the_readme(models):
    readme = README.read_text()
    for claim in evaluate_claims(models):
        assert claim.rule in readme, claim.rule
    json.dumps([dataclasses.asdict(c) for c in evaluate_claims(models)])  # plain values only
