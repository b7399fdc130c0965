"""Head names (L1H4) and activation hook names, checked against a model's shape and its cache."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.names import head_name, hook_name, parse_head

from conftest import random_model

CFG = qkov.Config(n_layers=2, n_heads=3, d_model=8, d_head=4, d_vocab=10, n_ctx=6)


def test_head_names_round_trip():
    for layer in range(CFG.n_layers):
        for head in range(CFG.n_heads):
            assert parse_head(head_name(layer, head), CFG) == (layer, head)


@pytest.mark.parametrize(
    "name, message", [("L2H0", "no head L2H0"), ("L0H3", "no head L0H3"), ("h1", "not a head")]
)
def test_a_head_that_does_not_exist_is_named(name, message):
    with pytest.raises(qkov.QkovError, match=message):
        parse_head(name, CFG)


def test_hook_names_are_the_cache_keys():
    _, cache = random_model(CFG).run_with_cache(torch.zeros(1, 4, dtype=torch.long))
    for layer in range(CFG.n_layers):
        for hook in ("pattern", "result", "resid_pre", "resid_post"):
            assert hook_name(layer, hook) in cache
    assert hook_name(1, "pattern") == "blocks.1.attn.hook_pattern"  # TransformerLens' name
    with pytest.raises(qkov.QkovError, match="no hook 'mlp'"):
        hook_name(0, "mlp")
