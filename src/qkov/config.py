"""The shape of an attention-only transformer, as in the paper's "Model Details" appendix.

An attention-only model has no MLP, no LayerNorm and (by default) no biases. Its positions follow
one of three schemes:

- ``"shortformer"`` (the paper's): ``W_pos[:pos]`` is added to the inputs of ``W_Q`` and ``W_K`` in
  every layer, never to the residual stream or the values, so the OV circuits never see position;
- ``"standard"``: ``W_pos[:pos]`` is added to the residual stream after the embedding (GPT-2);
- ``"none"``: no positional information at all (the model still has a causal mask).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from qkov.errors import QkovError

POSITIONAL_EMBEDDINGS = ("shortformer", "standard", "none")


@dataclass(frozen=True)
class Config:
    """Hyper-parameters of an attention-only transformer; the fields of ``config.json``."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    positional_embedding: str = "shortformer"

    def __post_init__(self) -> None:
        for name in ("n_heads", "d_model", "d_head", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QkovError(f"config: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.n_layers, int) or isinstance(self.n_layers, bool) or self.n_layers < 0:
            raise QkovError(f"config: n_layers must be a non-negative integer, got {self.n_layers!r}")
        if self.positional_embedding not in POSITIONAL_EMBEDDINGS:
            raise QkovError(
                f"config: positional_embedding must be one of {', '.join(POSITIONAL_EMBEDDINGS)}, "
                f"got {self.positional_embedding!r}"
            )

    @property
    def has_positions(self) -> bool:
        """Whether the model has a ``W_pos`` tensor."""
        return self.positional_embedding != "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Config:
        """Build a Config from parsed JSON, with one clear error for a missing or unknown field."""
        if not isinstance(data, dict):
            raise QkovError("config.json: expected a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        unknown = sorted(set(data) - names)
        missing = sorted(required - set(data))
        if unknown:
            raise QkovError(f"config.json: unknown field(s) {', '.join(unknown)}")
        if missing:
            raise QkovError(f"config.json: missing field(s) {', '.join(missing)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"
