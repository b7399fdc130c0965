"""Skip-trigrams of a one-layer head and the bugs their factored form forces."""

from __future__ import annotations

import numpy as np
import pytest

from qkov.circuits.skip_trigrams import (
    head_circuits,
    skip_trigram_bugs,
    skip_trigram_occurs,
    strongest_skip_trigrams,
)

from handbuilt import skip_trigram_model


def test_a_planted_skip_trigram_is_the_only_one_found():
    model = skip_trigram_model([(5, 3, 9)])
    trigrams = strongest_skip_trigrams(head_circuits(model, 0, 0), k=50)
    assert [(t.source, t.destination, t.out) for t in trigrams] == [(5, 3, 9)]
    t = trigrams[0]
    qk_scale = 64.0 / model.cfg.d_head**0.5
    assert t.qk == pytest.approx(qk_scale * 15 / 16) and t.ov == pytest.approx(5.0 * 15 / 16)
    assert t.strength == pytest.approx(t.qk * t.ov)
    for head in (1, 2):  # zero QK circuits: no skip-trigram at all
        assert strongest_skip_trigrams(head_circuits(model, 0, head), k=50) == []


def test_two_skip_trigrams_sharing_a_source_force_the_crossed_ones():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)])
    circuits = head_circuits(model, 0, 0)
    trigrams = strongest_skip_trigrams(circuits, k=50)
    assert {(t.destination, t.out) for t in trigrams} == {(3, 9), (4, 10), (3, 10), (4, 9)}
    bugs = skip_trigram_bugs(circuits, trigrams)
    assert bugs
    planted = {(3, 9), (4, 10)}
    bug = next(b for b in bugs if {b.first, b.second} == planted)
    assert {(c.destination, c.out) for c in bug.crossed} == {(3, 10), (4, 9)}
    corpus = np.array([5, 1, 1, 3, 9, 2, 2, 5, 4, 10, 2, 3, 10])  # "3 10" occurs, but not after a 5 nearby
    assert skip_trigram_occurs(corpus, 5, 3, 9, window=4)
    assert skip_trigram_occurs(corpus, 5, 4, 10, window=4)
    assert not skip_trigram_occurs(corpus, 5, 3, 10, window=4)
    assert skip_trigram_occurs(corpus, 5, 3, 10, window=8)
    assert not skip_trigram_occurs(corpus, 5, 4, 9, window=13)
