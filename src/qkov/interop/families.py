"""Hugging Face model families in: one adapter per ``model_type``, each reading its ``config.json``
keys and weight names and giving qkov's :class:`~qkov.config.Config` and TransformerLens' names.

Every adapter is a few lines on top of the shared readers below: a family is a choice of options of
the one qkov model (:mod:`qkov.config`), not a class of its own. Linear layers are stored
``[out, in]`` and applied as ``x @ W.T``; qkov's row-vector weights are their transposes, split by
head: ``W_Q [n_heads, d_model, d_head]`` is ``q_proj.weight`` ``[(n_heads d_head), d_model]``
rearranged, ``W_O [n_heads, d_head, d_model]`` is ``o_proj.weight`` ``[d_model, (n_heads d_head)]``.
Grouped-query attention keeps one ``_W_K``/``_W_V`` per key/value head. What the model does that is
not a weight is folded in exactly, in float64: Gemma's RMSNorm ``1 + w`` becomes ``w``, its embedding
multiplier (``sqrt(d_model)``, a float32 buffer in ``transformers``) joins ``W_E``; OPT's learned
positions drop their two offset rows. GPT-2 itself is read by :mod:`qkov.interop.hf`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from torch import Tensor

from qkov.config import Config
from qkov.errors import QkovError

ACTIVATIONS = {
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# buffers some files hold that are not weights (rotary tables, causal masks)
_BUFFERS = (
    "rotary_emb.inv_freq",
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",
    ".attention.masked_bias",
)


class Reader:
    """A source's tensors by name, each taken once; :meth:`finish` refuses any left unread (a tensor
    the adapter does not know is a feature qkov would silently drop). ``state`` may read a tensor
    only when it is asked for (a lazy model's mapped shards): the reader never reads ahead."""

    def __init__(self, state: Mapping[str, Tensor], where: str) -> None:
        self.state, self.where, self.used = state, where, set()
        self.names = {name for name in state if not name.endswith(_BUFFERS)}

    def __call__(self, name: str) -> Tensor:
        if name not in self.names:
            raise QkovError(f"{self.where}: missing tensor {name}")
        self.used.add(name)
        return self.state[name]

    def optional(self, name: str) -> Tensor | None:
        return self(name) if name in self.names else None

    def finish(self) -> None:
        left = sorted(self.names - self.used)
        if left:
            raise QkovError(f"{self.where}: unexpected tensor {left[0]} (not part of this model's config)")


def heads_in(weight: Tensor, n: int) -> Tensor:
    """``[(n d_head), d_model]`` (a Linear reading the stream) -> ``[n, d_model, d_head]``."""
    return rearrange(weight, "(n e) d -> n d e", n=n).contiguous()


def heads_out(weight: Tensor, n: int) -> Tensor:
    """``[d_model, (n d_head)]`` (a Linear writing the stream) -> ``[n, d_head, d_model]``."""
    return rearrange(weight, "d (n e) -> n e d", n=n).contiguous()


def head_bias(bias: Tensor | None, n: int) -> Tensor | None:
    return None if bias is None else rearrange(bias, "(n e) -> n e", n=n).contiguous()


def put(out: dict[str, Tensor], name: str, tensor: Tensor | None) -> None:
    """``out[name] = tensor`` unless it is absent (an absent bias is zero)."""
    if tensor is not None:
        out[name] = tensor


def attention(out: dict, layer: int, cfg: Config, q, k, v, o, biases=(None, None, None, None)) -> None:
    """A layer's attention weights from Linear layouts (``q``, ``k``, ``v``, ``o`` as stored)."""
    a, h, kv = f"blocks.{layer}.attn.", cfg.n_heads, cfg.n_kv_heads
    grouped = "_" if kv != h else ""
    out[a + "W_Q"], out[a + "W_O"] = heads_in(q, h), heads_out(o, h)
    out[a + grouped + "W_K"], out[a + grouped + "W_V"] = heads_in(k, kv), heads_in(v, kv)
    b_q, b_k, b_v, b_o = biases
    put(out, a + "b_Q", head_bias(b_q, h))
    put(out, a + grouped + "b_K", head_bias(b_k, kv))
    put(out, a + grouped + "b_V", head_bias(b_v, kv))
    put(out, a + "b_O", b_o)


def mlp(out: dict, layer: int, w_in, w_out, b_in=None, b_out=None, w_gate=None, b_gate=None) -> None:
    """A layer's MLP from Linear layouts (``[d_mlp, d_model]`` in, ``[d_model, d_mlp]`` out), as
    transposed views: whoever keeps them copies them (a lazy model reading a layer's attention
    drops them unread, and at Llama-3.1-8B's shapes a copy is 352 MiB in bfloat16)."""
    m = f"blocks.{layer}.mlp."
    out[m + "W_in"], out[m + "W_out"] = w_in.T, w_out.T
    put(out, m + "W_gate", None if w_gate is None else w_gate.T)
    put(out, m + "b_in", b_in)
    put(out, m + "b_gate", b_gate)
    put(out, m + "b_out", b_out)


def norm(out: dict, name: str, read: Reader, prefix: str, offset: bool = False) -> None:
    """A norm's weight (and bias, when it has one) under qkov's ``{name}.w`` / ``.b``; ``offset``:
    Gemma's ``1 + w``, folded."""
    w = read(prefix + ".weight")
    out[name + ".w"] = 1.0 + w.double() if offset else w
    put(out, name + ".b", read.optional(prefix + ".bias"))


def unembed(out: dict, read: Reader, data: dict, embed: str, head: str = "lm_head") -> None:
    """``W_U`` (and ``b_U``): the LM head's transpose, or ``W_E^T`` when the embeddings are tied
    (the file then has no head, or a copy of the embedding)."""
    weight = read.optional(head + ".weight")
    if weight is None:
        if not data.get("tie_word_embeddings", True):
            raise QkovError(f"{read.where}: missing tensor {head}.weight (tie_word_embeddings is false)")
        weight = read.state[embed]
    out["W_U"] = weight.T.contiguous()
    put(out, "b_U", read.optional(head + ".bias"))


# -- config readers shared by the families --------------------------------------------------------
def need(data: dict, where: str, *keys: str) -> Any:
    """The first of ``keys`` present in the config (families name the same thing differently)."""
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    raise QkovError(f"{where}: missing field {keys[0]}")


def activation(data: dict, where: str, *keys: str) -> str:
    name = need(data, where, *keys)
    if name not in ACTIVATIONS:
        raise QkovError(f"{where}: activation {name!r} is not supported ({keys[0]})")
    return ACTIVATIONS[name]


def rope(data: dict, where: str, layer_type: str | None = None) -> dict:
    """The rotary parameters: ``rope_parameters`` (``transformers`` 5, per layer type for Gemma 3),
    else the older ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` keys."""
    params = data.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:
        params = params[layer_type]
    if not isinstance(params, dict):
        params = dict(data.get("rope_scaling") or {})
        params.setdefault("rope_theta", data.get("rope_theta", data.get("rotary_emb_base", 10000.0)))
        params.setdefault(
            "partial_rotary_factor", data.get("partial_rotary_factor", data.get("rotary_pct", 1.0))
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise QkovError(
            f"{where}: rotary scaling {kind!r} is not supported (rope_type; default, linear, llama3)"
        )
    return params | {"rope_type": kind}


def rotary_fields(data: dict, where: str, d_head: int) -> dict:
    """The qkov config fields of a family's rotary positions (Gemma 3's sliding layers: their own base)."""
    params = rope(data, where, "full_attention")
    dim = int(d_head * params.get("partial_rotary_factor", 1.0))
    scaling = (
        None
        if params["rope_type"] == "default"
        else {
            key: params[key]
            for key in (
                "rope_type",
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            )
            if key in params
        }
    )
    fields = dict(
        positional_embedding="rotary", rotary_base=float(params["rope_theta"]), rotary_scaling=scaling
    )
    fields["rotary_dim"] = None if dim == d_head else dim
    if isinstance(data.get("rope_parameters"), dict) and "sliding_attention" in data["rope_parameters"]:
        fields["rotary_local_base"] = float(rope(data, where, "sliding_attention")["rope_theta"])
    return fields


def windows(data: dict, n_layers: int, every_layer: bool) -> tuple[int | None, ...] | None:
    """Per-layer sliding windows: from ``layer_types`` when the config lists them, else the one
    ``sliding_window`` on every layer (``every_layer``: Mistral, Phi-3, StarCoder 2)."""
    window = data.get("sliding_window")
    if not window:
        return None
    if data.get("layer_types"):
        return tuple(window if t == "sliding_attention" else None for t in data["layer_types"][:n_layers])
    return (window,) * n_layers if every_layer else None


def soft_caps(data: dict) -> dict:
    return dict(
        attn_scores_soft_cap=data.get("attn_logit_softcapping") or None,
        output_logits_soft_cap=data.get("final_logit_softcapping") or None,
    )


def bos(data: dict, vocab: int) -> int | None:
    token = data.get("bos_token_id")
    return token if isinstance(token, int) and 0 <= token < vocab else None


@dataclass(frozen=True)
class Family:
    """An adapter: ``config(data, where)`` is the qkov config of a ``config.json``; ``ends(read,
    cfg, data)`` gives qkov's embedding, positions, final norm and unembedding from the source's
    tensors (all read through ``read``), ``layer(read, cfg, layer)`` one layer's tensors: a lazy
    model (:mod:`qkov.interop.lazy`) reads one layer at a time, :meth:`tensors` all at once."""

    config: Callable[[dict, str], Config]
    ends: Callable[[Reader, Config, dict], dict[str, Tensor]]
    layer: Callable[[Reader, Config, int], dict[str, Tensor]]

    def tensors(self, read: Reader, cfg: Config, data: dict) -> dict[str, Tensor]:
        """Every tensor of the model in qkov's names."""
        out = self.ends(read, cfg, data)
        for layer in range(cfg.n_layers):
            out |= self.layer(read, cfg, layer)
        return out


def head_dim(data: dict, where: str) -> int:
    d, h = need(data, where, "hidden_size", "n_embd"), need(data, where, "num_attention_heads", "n_head")
    explicit = data.get("head_dim")
    if explicit:
        return explicit
    if d % h:
        raise QkovError(f"{where}: hidden_size={d} is not a multiple of num_attention_heads={h}")
    return d // h


def scaled_sqrt(d_model: int) -> float:
    """Gemma's embedding multiplier as ``transformers`` holds it: ``sqrt(d_model)`` in float32."""
    return float(torch.tensor(math.sqrt(d_model), dtype=torch.float32))
