"""The hand-built models with known answers, for the tests (they live in :mod:`qkov.handbuilt`, where
the tutorials use them too)."""

from qkov.handbuilt import (
    attend_to_previous,
    blocks_model,
    induction_model,
    neuron_model,
    pointer_arithmetic_model,
    skip_trigram_model,
    two_back_model,
    with_layer_norm,
    with_recent_head,
)

__all__ = [
    "attend_to_previous",
    "blocks_model",
    "induction_model",
    "neuron_model",
    "pointer_arithmetic_model",
    "skip_trigram_model",
    "two_back_model",
    "with_layer_norm",
    "with_recent_head",
]
