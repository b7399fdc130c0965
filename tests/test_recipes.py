"""Recipes: the defaults per depth, the paper's sizes, and the one way overrides become configs."""

from __future__ import annotations

import pytest

import qkov
from qkov.recipes import recipe


def test_overrides_go_to_the_model_or_the_training_config():
    r = recipe(2).override(d_model=64, steps=10, vocab_size=1000, seed=3, lr=None)
    cfg, train_cfg = r.configs(d_vocab=997)
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab, cfg.n_heads) == (2, 64, 997, 4)
    assert (train_cfg.steps, train_cfg.seed, train_cfg.lr) == (10, 3, recipe(2).train.lr)
    assert r.vocab_size == 1000
    with pytest.raises(qkov.QkovError, match="unknown setting 'colour'"):
        recipe(1).override(colour="red")


def test_the_paper_preset_has_the_papers_sizes():
    cfg, train_cfg = recipe(2, "paper").configs(d_vocab=50257)
    assert (cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_ctx) == (12, 64, 768, 2048)
    assert train_cfg.precision == "bf16"
    with pytest.raises(qkov.QkovError, match="--preset"):
        recipe(2, "huge")
    with pytest.raises(qkov.QkovError, match="--layers"):
        recipe(-1)


@pytest.mark.parametrize(
    "n_layers, heads, d_head, steps, batch, schedule",
    [(0, 4, 32, 1000, 16, "cosine"), (1, 8, 16, 14000, 8, "constant"), (2, 4, 32, 14000, 8, "constant"),
     (3, 4, 32, 14000, 8, "constant")],
)  # fmt: skip
def test_every_depth_has_the_measured_recipe(n_layers, heads, d_head, steps, batch, schedule):
    """The defaults the README's "Choosing the defaults" measured: d_model 128, a 128-token context,
    and the tokenizer's actual vocabulary in place of the 2048 asked of it."""
    cfg, train_cfg = recipe(n_layers).configs(d_vocab=300)
    assert (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_ctx, cfg.d_vocab) == (
        n_layers, heads, d_head, 128, 128, 300
    )  # fmt: skip
    assert (train_cfg.steps, train_cfg.batch_size, train_cfg.lr, train_cfg.schedule) == (
        steps,
        batch,
        5e-3,
        schedule,
    )
    assert recipe(n_layers).vocab_size == 2048
    if n_layers >= 1:  # the 1-layer control logs its evaluations where the 2-layer run does
        assert recipe(n_layers).train == recipe(2).train
