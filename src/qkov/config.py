"""The shape of a transformer: by default attention-only, as in the paper's "Model Details" appendix.

The default model has no MLP, no LayerNorm and (by default) no biases. GPT-2-style models add
options of the same model (imported from Hugging Face or TransformerLens, or trained):

- ``normalization``: ``"none"`` (the paper's models), ``"LN"`` (LayerNorm with weight ``w`` and bias
  ``b`` before each attention layer, each MLP and the unembedding, as GPT-2) or ``"LNPre"``
  (LayerNorm whose ``w`` and ``b`` were folded into the following weights: centre and divide by the
  scale only, as TransformerLens names it; appendix "Handling Layer Normalization");
- ``d_mlp``: the MLP's hidden width after each attention layer (0: attention-only), with ``act_fn``;
- ``ln_eps``: LayerNorm's epsilon;
- ``source``: where the weights came from (``"qkov"``: trained here, ``"huggingface"``,
  ``"transformer_lens"``), so results can say so;
- ``d_vocab_out``: the width of the unembedding when the model's outputs are not its input tokens
  (a classifier's 2 classes; ``None``: ``d_vocab``, a language model's next token);
- ``bos_token_id``: the start token the model's sequences begin with in training (``None``: none,
  qkov's own models). The repeated-token test then reads ``[BOS]`` followed by the repeats, as the
  paper's own induction test begins with ``<START>``, and corpus windows and typed text begin with it.

Positions follow one of three schemes:

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
NORMALIZATIONS = ("none", "LN", "LNPre")
ACT_FNS = ("gelu_new", "gelu", "relu")
SOURCES = ("qkov", "huggingface", "transformer_lens")


@dataclass(frozen=True)
class Config:
    """Hyper-parameters of a transformer; the fields of ``config.json``. A ``config.json`` written
    before LayerNorm and MLPs existed lacks the new fields and loads with their defaults: the
    attention-only model it describes."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    positional_embedding: str = "shortformer"
    normalization: str = "none"
    d_mlp: int = 0
    act_fn: str = "gelu_new"
    ln_eps: float = 1e-5
    source: str = "qkov"
    d_vocab_out: int | None = None
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_heads", "d_model", "d_head", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QkovError(f"config: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.n_layers, int) or isinstance(self.n_layers, bool) or self.n_layers < 0:
            raise QkovError(f"config: n_layers must be a non-negative integer, got {self.n_layers!r}")
        for name, allowed in (
            ("positional_embedding", POSITIONAL_EMBEDDINGS),
            ("normalization", NORMALIZATIONS),
            ("act_fn", ACT_FNS),
            ("source", SOURCES),
        ):
            if getattr(self, name) not in allowed:
                raise QkovError(
                    f"config: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if not isinstance(self.d_mlp, int) or isinstance(self.d_mlp, bool) or self.d_mlp < 0:
            raise QkovError(f"config: d_mlp must be a non-negative integer, got {self.d_mlp!r}")
        if isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, int | float) or not self.ln_eps > 0:
            raise QkovError(f"config: ln_eps must be a positive number, got {self.ln_eps!r}")
        out = self.d_vocab_out
        if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
            raise QkovError(f"config: d_vocab_out must be a positive integer or null, got {out!r}")
        bos = self.bos_token_id
        if bos is not None and (
            not isinstance(bos, int) or isinstance(bos, bool) or not 0 <= bos < self.d_vocab
        ):
            raise QkovError(
                f"config: bos_token_id must be a token id in [0, {self.d_vocab}) or null, got {bos!r}"
            )

    @property
    def d_out(self) -> int:
        """The unembedding's width: ``d_vocab_out``, else ``d_vocab``."""
        return self.d_vocab if self.d_vocab_out is None else self.d_vocab_out

    @property
    def outputs_tokens(self) -> bool:
        """Whether the outputs are over the input vocabulary, so that token-to-token circuits
        (``W_E ... W_U``: bigrams, skip-trigrams, OV copying) are square and the next token can be
        the target."""
        return self.d_out == self.d_vocab

    @property
    def has_positions(self) -> bool:
        """Whether the model has a ``W_pos`` tensor."""
        return self.positional_embedding != "none"

    @property
    def has_mlp(self) -> bool:
        return self.d_mlp > 0

    @property
    def has_layer_norm(self) -> bool:
        """Whether the residual stream is normalised (``LN`` or ``LNPre``) before it is read."""
        return self.normalization != "none"

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
