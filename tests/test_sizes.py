"""The memory a config implies, refused in one line before anything is allocated."""

from __future__ import annotations

import dataclasses

import pytest

import qkov
from qkov.sizes import MAX_LAYERS, check_model_size, human_bytes, model_bytes, parameter_count

from conftest import random_model


@pytest.mark.parametrize(
    "cfg",
    [
        qkov.Config(n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=20, n_ctx=8),
        qkov.Config(
            n_layers=2,
            n_heads=3,
            d_model=12,
            d_head=4,
            d_vocab=20,
            n_ctx=8,
            normalization="LN",
            d_mlp=16,
            positional_embedding="standard",
            d_vocab_out=3,
        ),  # fmt: skip
    ],
)
def test_the_count_covers_every_weight_with_biases(cfg):
    model = random_model(cfg, biases=True)
    built = sum(p.numel() for p in model.parameters())
    assert parameter_count(cfg) == built


def test_absurd_sizes_are_refused_with_their_bytes(monkeypatch):
    monkeypatch.setenv("QKOV_MAX_BYTES", str(2**30))
    small = qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=20, n_ctx=8)
    check_model_size(small)
    wide = dataclasses.replace(small, d_model=10**7)
    with pytest.raises(qkov.QkovError, match=r"would take .*GiB.*more than the 1\.0 GiB") as info:
        check_model_size(wide, "train")
    assert human_bytes(model_bytes(wide)) in str(info.value)
    with pytest.raises(qkov.QkovError, match=f"n_layers 1,000,000 is more than {MAX_LAYERS:,}"):
        check_model_size(dataclasses.replace(small, n_layers=10**6))


def test_a_bad_budget_variable_is_one_line(monkeypatch):
    monkeypatch.setenv("QKOV_MAX_BYTES", "lots")
    with pytest.raises(qkov.QkovError, match="QKOV_MAX_BYTES must be a number"):
        check_model_size(qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=20, n_ctx=8))
