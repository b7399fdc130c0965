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

The architectures of today's open-weight models (Llama, Gemma, Qwen, Pythia, OLMo, ...) are the same
model with a few more orthogonal options, each ``None``/off by default (imported from Hugging Face
by :mod:`qkov.interop.families`):

- ``normalization`` ``"RMS"`` (RMSNorm, ``x / rms(x) * w``, no centring and no bias) or ``"RMSPre"``
  (its ``w`` folded into the next weights);
- ``rotary_dim``, ``rotary_base``, ``rotary_interleaved``, ``rotary_scaling``, ``rotary_local_base``:
  rotary positions (``positional_embedding="rotary"``) on the first ``rotary_dim`` dimensions of
  every query and key (``None``: all ``d_head``), frequencies ``base^(-2i/rotary_dim)`` as
  ``transformers`` computes them (float32), rescaled by ``rotary_scaling`` (``{"rope_type":
  "linear", "factor"}`` or Llama 3's by-parts rule), in the NeoX half-split layout or GPT-J's
  interleaved pairs; layers with a sliding window use ``rotary_local_base`` when set (Gemma 3);
- ``n_key_value_heads``: grouped-query attention (``1``: multi-query); query head ``h`` reads key
  and value head ``h // (n_heads / n_key_value_heads)``;
- ``gated_mlp``: ``(act(x W_gate) * (x W_in)) W_out`` (SwiGLU, GeGLU);
- ``parallel_attn_mlp``: attention and MLP read the same stream (GPT-J, NeoX);
- ``qk_norm``: ``"head"`` (an RMSNorm of each head's query and key over ``d_head``, Qwen 3, Gemma
  3) or ``"all"`` (over all heads' queries, and all keys, OLMo 2);
- ``pre_norms`` / ``post_norms``: a norm before each sublayer (default) and/or after it, on its
  write (Gemma 2 and 3: both; OLMo 2: after only);
- ``attn_scale`` (``None``: ``sqrt(d_head)``), ``scale_attn_by_inverse_layer_idx`` (scores of layer
  ``l`` also divided by ``l + 1``), ``attn_scores_soft_cap`` and ``output_logits_soft_cap``
  (``cap * tanh(x / cap)``), ``layer_windows`` (per layer, the sliding window: a query attends to
  the ``window`` latest positions, itself included; ``None``: all), ``attention_dir``
  (``"bidirectional"``: no causal mask).

Positions follow one of four schemes:

- ``"shortformer"`` (the paper's): ``W_pos[:pos]`` is added to the inputs of ``W_Q`` and ``W_K`` in
  every layer, never to the residual stream or the values, so the OV circuits never see position;
- ``"standard"``: ``W_pos[:pos]`` is added to the residual stream after the embedding (GPT-2);
- ``"rotary"``: queries and keys are rotated by an angle proportional to their position, so a
  score depends on the offset between query and key (Su et al.'s RoPE); no ``W_pos``;
- ``"none"``: no positional information at all (the model still has a causal mask).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from qkov.errors import QkovError

POSITIONAL_EMBEDDINGS = ("shortformer", "standard", "rotary", "none")
NORMALIZATIONS = ("none", "LN", "LNPre", "RMS", "RMSPre")
ACT_FNS = ("gelu_new", "gelu", "relu", "silu")
QK_NORMS = ("none", "head", "all")
ATTENTION_DIRS = ("causal", "bidirectional")
ROPE_TYPES = ("linear", "llama3")
SOURCES = ("qkov", "huggingface", "transformer_lens")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_interleaved: bool = False
    rotary_scaling: dict[str, Any] | None = None
    rotary_local_base: float | None = None
    n_key_value_heads: int | None = None
    gated_mlp: bool = False
    parallel_attn_mlp: bool = False
    qk_norm: str = "none"
    pre_norms: bool = True
    post_norms: bool = False
    attn_scale: float | None = None
    scale_attn_by_inverse_layer_idx: bool = False
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    layer_windows: tuple[int | None, ...] | None = None
    attention_dir: str = "causal"

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
            ("qk_norm", QK_NORMS),
            ("attention_dir", ATTENTION_DIRS),
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

        self._check_architecture()

    def _check_architecture(self) -> None:
        """The options of today's open-weight architectures (see the module docstring)."""
        if self.layer_windows is not None:
            windows = tuple(self.layer_windows)
            if len(windows) != self.n_layers or not all(w is None or _positive_int(w) for w in windows):
                raise QkovError(
                    f"config: layer_windows must list {self.n_layers} positive integers or nulls, "
                    f"got {windows!r}"
                )
            object.__setattr__(self, "layer_windows", windows)  # a JSON list becomes a hashable tuple
        kv = self.n_key_value_heads
        if kv is not None and not (_positive_int(kv) and self.n_heads % kv == 0):
            raise QkovError(f"config: n_key_value_heads must divide n_heads={self.n_heads}, got {kv!r}")
        for name in ("rotary_base", "attn_scale", "attn_scores_soft_cap", "output_logits_soft_cap",
                     "rotary_local_base"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (_number(value) and value > 0):
                raise QkovError(f"config: {name} must be a positive number or null, got {value!r}")
        rd = self.rotary_dim
        if rd is not None and not (_positive_int(rd) and rd % 2 == 0 and rd <= self.d_head):
            raise QkovError(
                f"config: rotary_dim must be an even integer in [2, d_head={self.d_head}], got {rd!r}"
            )
        if self.positional_embedding == "rotary" and self.d_head % 2 and rd is None:
            raise QkovError(
                f"config: rotary positions need an even d_head (or rotary_dim), got {self.d_head}"
            )
        scaling = self.rotary_scaling
        if scaling is not None and (
            not isinstance(scaling, dict) or scaling.get("rope_type") not in ROPE_TYPES
        ):
            raise QkovError(
                f"config: rotary_scaling must be null or a dict whose rope_type is one of "
                f"{', '.join(ROPE_TYPES)}, got {scaling!r}"
            )
        flags = ("rotary_interleaved", "gated_mlp", "parallel_attn_mlp", "pre_norms", "post_norms",
                 "scale_attn_by_inverse_layer_idx")  # fmt: skip
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise QkovError(f"config: {name} must be true or false, got {getattr(self, name)!r}")
        if (self.post_norms or not self.pre_norms or self.qk_norm != "none") and not self.has_layer_norm:
            raise QkovError("config: pre_norms=false, post_norms and qk_norm need a normalization")

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
        """Whether the model has a ``W_pos`` tensor (learned positions: standard or shortformer)."""
        return self.positional_embedding in ("shortformer", "standard")

    @property
    def has_mlp(self) -> bool:
        return self.d_mlp > 0

    @property
    def n_kv_heads(self) -> int:
        """The number of key and value heads: ``n_key_value_heads``, else ``n_heads``."""
        return self.n_key_value_heads or self.n_heads

    @property
    def is_rms(self) -> bool:
        """Whether the norms are RMSNorms (no centring, no bias)."""
        return self.normalization in ("RMS", "RMSPre")

    @property
    def affine_norms(self) -> bool:
        """Whether the norms carry their own weights (``"LN"``, ``"RMS"``), not yet folded."""
        return self.normalization in ("LN", "RMS")

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: it attends to every earlier position)."""
        return None if self.layer_windows is None else self.layer_windows[layer]

    @property
    def features(self) -> tuple[str, ...]:
        """The options beyond the paper's and GPT-2's models this config uses, by name: what an
        analysis that cannot handle one of them names when it skips."""
        checks = (
            ("rotary positions", self.positional_embedding == "rotary"),
            ("RMSNorm", self.is_rms),
            ("grouped-query attention", self.n_kv_heads != self.n_heads),
            ("a gated MLP", self.gated_mlp),
            ("parallel attention and MLP", self.parallel_attn_mlp),
            ("query and key norms", self.qk_norm != "none"),
            ("norms after each sublayer", self.post_norms or not self.pre_norms),
            ("an attention scale other than sqrt(d_head)", self.attn_scale is not None
             or self.scale_attn_by_inverse_layer_idx),
            ("attention soft-capping", self.attn_scores_soft_cap is not None),
            ("logit soft-capping", self.output_logits_soft_cap is not None),
            ("sliding windows", any(w is not None for w in self.layer_windows or ())),
            ("bidirectional attention", self.attention_dir == "bidirectional"),
        )  # fmt: skip
        return tuple(name for name, present in checks if present)

    @property
    def has_layer_norm(self) -> bool:
        """Whether the residual stream is normalised (``LN`` or ``LNPre``) before it is read."""
        return self.normalization != "none"

    def __repr__(self) -> str:
        """The fields, without the newer architectures' options that keep their defaults (as
        :meth:`to_dict`), so that a paper model prints as it always did."""
        return f"Config({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values; the options of the newer architectures only when set, so that a
        paper model's ``config.json`` reads as it always did."""
        data = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in NEW_ARCHITECTURE_FIELDS:
            if data[name] == defaults[name]:
                del data[name]
        if data.get("layer_windows") is not None:
            data["layer_windows"] = list(data["layer_windows"])
        return data

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


NEW_ARCHITECTURE_FIELDS = tuple(f.name for f in dataclasses.fields(Config))[
    tuple(f.name for f in dataclasses.fields(Config)).index("rotary_dim") :
]
