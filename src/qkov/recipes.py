"""Default model and training settings per depth, chosen by measurement on 2 CPU cores, and the one
place where a recipe plus a user's overrides becomes the model's :class:`Config` and the run's
:class:`TrainConfig` (used by ``qkov train`` and ``qkov reproduce`` alike).

Each recipe is the smallest, fastest configuration measured here in which the paper's finding for
that depth shows up: bigram statistics (0 layers), copying heads (1 layer), a previous-token head
and induction heads (2 layers). The measurements are in the README ("Choosing the defaults").
``paper`` gives the sizes of the paper's own models ("Model Details").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from qkov.config import Config
from qkov.errors import QkovError
from qkov.schedule import TrainConfig

PRESETS = ("default", "paper")


@dataclass(frozen=True)
class Recipe:
    """A model shape and the settings to train it. ``model.d_vocab`` is the vocabulary size asked of
    the tokenizer; the trained tokenizer's actual size replaces it in :meth:`configs`."""

    model: Config
    train: TrainConfig

    @property
    def vocab_size(self) -> int:
        return self.model.d_vocab

    def override(self, **values: Any) -> Recipe:
        """The recipe with every value that is not None put in place: a :class:`Config` field, a
        :class:`TrainConfig` field, or ``vocab_size``. An explicit flag always wins over the recipe."""
        model_fields = {f.name for f in dataclasses.fields(Config)}
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        model, train = {}, {}
        for name, value in values.items():
            if value is None:
                continue
            if name == "vocab_size":
                name = "d_vocab"
            if name in model_fields:
                model[name] = value
            elif name in train_fields:
                train[name] = value
            else:
                raise QkovError(f"recipe: unknown setting {name!r}")
        return Recipe(replace(self.model, **model), replace(self.train, **train))

    def configs(self, d_vocab: int) -> tuple[Config, TrainConfig]:
        """The model config (with the tokenizer's vocabulary size) and the training config."""
        return replace(self.model, d_vocab=d_vocab), self.train


def recipe(n_layers: int, preset: str = "default") -> Recipe:
    """The default settings for a model of ``n_layers`` attention layers.

    ``preset="paper"``: the paper's sizes, 12 heads of 64 (d_model 768), a 2048-token context and a
    byte-level BPE vocabulary of 50,257 tokens, GPT-2's size (the paper's own tokenizer is not
    published); batch and steps sized for one GPU (see the README).
    """
    if n_layers < 0:
        raise QkovError(f"--layers must be 0 or more, got {n_layers}")
    if preset == "paper":
        return Recipe(
            Config(n_layers, n_heads=12, d_model=768, d_head=64, d_vocab=50257, n_ctx=2048),
            TrainConfig(steps=10000, batch_size=32, lr=1e-3, precision="bf16", eval_every=500,
                        checkpoint_every=1000),
        )  # fmt: skip
    if preset != "default":
        raise QkovError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    # One 2048-token vocabulary for every depth: 1.4x (2 layers) to 2.2x (0 layers) the tokens/s of
    # 4096 on 2 cores, and the induction heads form earlier in tokens (README, "Choosing the defaults").
    if n_layers == 0:
        return Recipe(
            Config(0, n_heads=4, d_model=128, d_head=32, d_vocab=2048, n_ctx=128),
            TrainConfig(steps=1000, batch_size=16, lr=5e-3, eval_every=500, checkpoint_every=500),
        )
    # A constant rate after a fixed warm-up: the induction heads formed (90% of their rise) by 12.2M-13.4M
    # tokens in three seeds, against 18.7M-21.2M with cosine decay at vocabulary 4096; the run stops
    # just past the latest of them, at 14.3M tokens.
    schedule = TrainConfig(steps=14000, batch_size=8, lr=5e-3, warmup_steps=1200, schedule="constant",
                           eval_every=2000, checkpoint_every=2000)  # fmt: skip
    if n_layers == 1:
        # The phase change's control: the 2-layer run's token schedule, so that its in-context-learning
        # score is logged through the 2-layer window (qkov.circuits.phase_change.control_test); the
        # earlier 1500 steps of 16 (3.07M tokens, cosine) stopped before the window began.
        return Recipe(Config(1, n_heads=8, d_model=128, d_head=16, d_vocab=2048, n_ctx=128), schedule)
    return Recipe(Config(n_layers, n_heads=4, d_model=128, d_head=32, d_vocab=2048, n_ctx=128), schedule)
