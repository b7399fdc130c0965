"""Default model and training settings per depth, chosen by measurement on 2 CPU cores.

Each recipe is the smallest, fastest configuration measured here in which the paper's finding for
that depth shows up: bigram statistics (0 layers), copying heads (1 layer), a previous-token head
and induction heads (2 layers). The measurements are in the README ("Choosing the defaults").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    d_model: int
    n_heads: int
    d_head: int
    n_ctx: int
    vocab_size: int
    steps: int
    batch_size: int
    lr: float
    precision: str
    eval_every: int
    checkpoint_every: int
    embed_lr_mult: float = 1.0


def recipe(n_layers: int) -> Recipe:
    """The default settings for a model of ``n_layers`` attention layers."""
    if n_layers == 0:
        return Recipe(
            d_model=128, n_heads=4, d_head=32, n_ctx=128, vocab_size=4096, steps=1000, batch_size=16,
            lr=5e-3, precision="fp32", eval_every=100, checkpoint_every=500,
        )  # fmt: skip
    if n_layers == 1:
        return Recipe(
            d_model=128, n_heads=8, d_head=16, n_ctx=128, vocab_size=4096, steps=1500, batch_size=16,
            lr=5e-3, precision="fp32", eval_every=100, checkpoint_every=500,
        )  # fmt: skip
    return Recipe(
        d_model=128, n_heads=4, d_head=32, n_ctx=128, vocab_size=4096, steps=24000, batch_size=8,
        lr=5e-3, precision="fp32", eval_every=500, checkpoint_every=2000,
    )  # fmt: skip
