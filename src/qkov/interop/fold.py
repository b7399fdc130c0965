"""Folding LayerNorm into the adjacent weights, and centring (the paper's appendix "Handling Layer
Normalization"; the same four steps, in the same order, as TransformerLens'
``load_and_process_state_dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
fold_value_biases=True)``).

A LayerNorm ``LN(x) = (x - mean(x)) / scale(x) * w + b`` before a linear map ``x @ W + c`` (row
vectors; the paper's ``W x + c``) is the same as a weight-free norm ``LNPre(x) = (x - mean(x)) /
scale(x)`` before ``x @ (diag(w) W) + (b @ W + c)``: only the per-position scale cannot be folded.

1. *fold LayerNorm* (``normalization="LN"`` only): ``ln1`` into ``W_Q``, ``W_K``, ``W_V`` (and their
   biases), ``ln2`` into ``W_in``/``b_in``, ``ln_final`` into ``W_U``/``b_U``; then those reading
   weights are centred over ``d_model`` (exact: ``LNPre``'s output has mean zero). The model
   becomes ``"LNPre"``.
2. *centre the writing weights* (with LayerNorm only): ``W_E``, ``W_pos``, ``W_O``, ``b_O``,
   ``W_out``, ``b_out`` lose their mean over ``d_model``; exact, since every reader of the stream
   centres it first.
3. *centre the unembedding*: ``W_U`` and ``b_U`` lose their mean over ``d_vocab``. This shifts every
   logit of a position by the same amount: log-probabilities are unchanged, logits are not.
4. *fold the value biases* into ``b_O``: ``b_O += Σ_h b_V^h W_O^h`` (each pattern row sums to 1),
   ``b_V = 0``.

With shortformer positions and LayerNorm, positions join the queries and keys *after* ``ln1``;
folding ``ln1``'s weight would scale them too, so step 1 (and centring ``W_pos``) is not exact and
is not done: the model keeps ``"LN"`` and :func:`fold` says so in its ``note``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
from einops import einsum
from torch import Tensor

from qkov.checkpoint import expected_shapes, model_from_tensors
from qkov.config import Config
from qkov.interop.lazy_model import LazyTransformer
from qkov.model import Transformer
from qkov.rotary import rotation

SHORTFORMER_NOTE = (
    "LayerNorm kept unfolded: shortformer positions join the queries and keys after ln1, so folding "
    "its weight into W_Q and W_K would not be exact"
)


class FoldNote(UserWarning):
    """Emitted (as a warning, one line) by an import whose folding could not be done exactly."""


@dataclass(frozen=True)
class Folded:
    """A folded model and, when a step could not be done exactly, one line saying why (else None)."""

    model: Transformer
    note: str | None


def state_with_biases(model: Transformer) -> dict[str, Tensor]:
    """Every parameter, cloned, with each absent bias as zeros (folding writes into biases)."""
    _, biases = expected_shapes(model.cfg)
    dtype = model.W_E.dtype
    state = {name: torch.zeros(shape, dtype=dtype) for name, shape in biases.items()}
    return state | {name: param.detach().clone() for name, param in model.named_parameters()}


def centre_(x: Tensor, dim: int) -> Tensor:
    """``x`` less its mean along ``dim``, in place."""
    return x.sub_(x.mean(dim, keepdim=True))


def holds(state: dict[str, Tensor], layer: int, part: str) -> bool:
    """Whether ``state`` holds layer ``layer``'s attention (``part="attn"``) or MLP (``"mlp"``):
    a lazy model folds a layer's attention when it reads the layer, its MLP when that is first
    used."""
    return f"blocks.{layer}.{part}.W_{'Q' if part == 'attn' else 'in'}" in state


def reading_names(cfg: Config, layer: int) -> list[str]:
    """The names of a layer's query, key and value weights in a state dict (grouped-query attention
    stores one ``_W_K``/``_W_V`` per key/value head)."""
    kv = "_" if cfg.n_kv_heads != cfg.n_heads else ""
    a = f"blocks.{layer}.attn."
    return [a + "W_Q", a + kv + "W_K", a + kv + "W_V"]


def fold_layer_norm(state: dict[str, Tensor], cfg: Config, layers: Iterable[int], ends: bool) -> None:
    """Step 1, in place: every pre-sublayer norm's ``w`` (and LayerNorm's ``b``) into the weights that
    read its output; with LayerNorm those are then centred (RMSNorm does not centre: nothing to
    centre for). Norms after a sublayer and query/key norms stay: their scale is computed on what
    their weight would multiply, so the weight cannot move. ``layers``: those whose tensors
    ``state`` holds (their attention, their MLP or both: :func:`holds`); ``ends``: whether it holds
    the final norm and the unembedding (a lazy model folds each layer as it reads it)."""
    for layer in layers if cfg.pre_norms else ():
        if holds(state, layer, "attn"):
            fold_attention_norm(state, cfg, layer)
        if holds(state, layer, "mlp"):
            fold_mlp_norm(state, cfg, layer)
    if not ends:
        return
    w, b = state.pop("ln_final.w"), state.pop("ln_final.b", None)
    if b is not None:
        state["b_U"] = state["b_U"] + b @ state["W_U"]
    state["W_U"].mul_(w[:, None])
    if not cfg.is_rms:
        centre_(state["W_U"], dim=0)


def fold_attention_norm(state: dict[str, Tensor], cfg: Config, layer: int) -> None:
    """``ln1`` into layer ``layer``'s queries, keys and values (:func:`fold_layer_norm`)."""
    ln = f"blocks.{layer}.ln1."
    w, b = state.pop(ln + "w"), state.pop(ln + "b", None)
    for name in reading_names(cfg, layer):
        W, bias = state[name], name.replace("W_", "b_")
        if b is not None:
            state[bias] = state[bias] + einsum(b, W, "d_model, h d_model e -> h e")
        W.mul_(w[None, :, None])
        if not cfg.is_rms:
            centre_(W, dim=1)


def fold_mlp_norm(state: dict[str, Tensor], cfg: Config, layer: int) -> None:
    """``ln2`` into layer ``layer``'s ``W_in`` (and ``W_gate``) (:func:`fold_layer_norm`)."""
    m, ln = f"blocks.{layer}.mlp.", f"blocks.{layer}.ln2."
    w, b = state.pop(ln + "w"), state.pop(ln + "b", None)
    for name in ["in"] + (["gate"] if cfg.gated_mlp else []):
        W = state[m + f"W_{name}"]
        if b is not None:
            state[m + f"b_{name}"] = state[m + f"b_{name}"] + b @ W
        W.mul_(w[:, None])
        if not cfg.is_rms:
            centre_(W, dim=0)


def center_writing_weights(state: dict[str, Tensor], cfg: Config, layers: Iterable[int], ends: bool) -> None:
    """Step 2, in place: what writes to the residual stream loses its mean over ``d_model`` (exact only
    when every reader of the stream is a LayerNorm, which centres it first); ``layers`` and
    ``ends`` as in :func:`fold_layer_norm`."""
    names = (["W_E"] + (["W_pos"] if cfg.positional_embedding == "standard" else [])) if ends else []
    for layer in layers:
        if holds(state, layer, "attn"):
            names += [f"blocks.{layer}.attn.W_O", f"blocks.{layer}.attn.b_O"]
        if holds(state, layer, "mlp"):
            names += [f"blocks.{layer}.mlp.W_out", f"blocks.{layer}.mlp.b_out"]
    for name in names:
        centre_(state[name], dim=-1)


def center_unembed(state: dict[str, Tensor]) -> None:
    """Step 3, in place: ``W_U`` and ``b_U`` lose their mean over ``d_vocab``."""
    centre_(state["W_U"], dim=-1)
    centre_(state["b_U"], dim=-1)


def fold_value_biases(state: dict[str, Tensor], cfg: Config, layers: Iterable[int]) -> None:
    """Step 4, in place, for ``layers``: ``b_O += Σ_h b_V^h W_O^h``, ``b_V = 0`` (re-centred with
    LayerNorm); with grouped-query attention each query head reads its group's ``b_V``."""
    group = cfg.n_heads // cfg.n_kv_heads
    for layer in (layer for layer in layers if holds(state, layer, "attn")):
        a, b_V = f"blocks.{layer}.attn.", reading_names(cfg, layer)[2].replace("W_", "b_")
        per_head = state[b_V].repeat_interleave(group, dim=0)
        b_O = state[a + "b_O"] + einsum(per_head, state[a + "W_O"], "h e, h e d -> d")
        state[a + "b_O"] = centre_(b_O, dim=-1) if centres(cfg) else b_O
        state[b_V] = torch.zeros_like(state[b_V])


def fold_tensors(
    state: dict[str, Tensor], cfg: Config, layers: Iterable[int], ends: bool, centre_unembed: bool = True
) -> tuple[Config, str | None]:
    """The four steps (see the module docstring), in place, on the tensors of ``layers`` that
    ``state`` holds (every bias present, zeros where the model has none) and, with ``ends``, on
    the embeddings, final norm and unembedding: the folded model's config, and the note when a step
    could not be done exactly. :func:`fold` runs it on a whole model, a lazy model on one layer at a
    time, so that both fold by the same code. ``state``'s tensors are the caller's own, not shared
    with anything else: they are overwritten (at Llama 3's vocabulary a copy of the unembedding made
    to scale or centre it is 2 GiB). Without ``centre_unembed`` step 3 is left to the caller (a
    narrow lazy model folds its unembedding a block of the vocabulary at a time: the mean over
    ``d_vocab`` is not one block's)."""
    layers, note = list(layers), None
    if cfg.affine_norms and cfg.positional_embedding == "shortformer":
        note = SHORTFORMER_NOTE
    elif cfg.affine_norms:
        fold_layer_norm(state, cfg, layers, ends)
        cfg = replace(cfg, normalization="RMSPre" if cfg.is_rms else "LNPre")
    if centres(cfg):
        center_writing_weights(state, cfg, layers, ends)
    if ends and centre_unembed and centres_unembed(cfg):
        center_unembed(state)
    fold_value_biases(state, cfg, layers)
    return cfg, note


def centres_unembed(cfg: Config) -> bool:
    """Whether the unembedding is centred over ``d_vocab`` (step 3): not under a soft-cap, which
    is not shift-invariant."""
    return cfg.output_logits_soft_cap is None


def centres(cfg: Config) -> bool:
    """Whether every reader of the residual stream centres it (LayerNorm before every sublayer and
    the unembedding), so that what writes to it may be centred."""
    return cfg.normalization in ("LN", "LNPre") and cfg.pre_norms


def fold(model: Transformer) -> Folded:
    """The model with LayerNorm folded, writing weights and unembedding centred and value biases
    folded (see the module docstring): the same log-probabilities, logits shifted by a constant
    per position. A new model; ``model`` is unchanged."""
    state = state_with_biases(model)
    with torch.no_grad():
        cfg, note = fold_tensors(state, model.cfg, range(model.cfg.n_layers), ends=True)
    folded = model_from_tensors(cfg, state, "folded model")
    folded.tokenizer = model.tokenizer
    return Folded(folded, note)


ANALYSIS_OFFSETS = range(1, 65)  # a rotary QK circuit in the analyses: a key 1 to 64 tokens back
VIEW_FEATURES = (
    "rotary positions", "query and key norms", "norms after each sublayer", "grouped-query attention",
    "an attention scale other than sqrt(d_head)",
)  # fmt: skip


def circuit_model(model: Transformer, offsets: range = ANALYSIS_OFFSETS) -> Transformer:
    """The weights the weight-based circuits read (QK/OV circuits, composition, copying,
    skip-trigrams, neurons): the model itself; with ``normalization="LN"`` or ``"RMS"`` its folded
    form, so that the norms' weights are part of every circuit (TransformerLens' convention) and an
    unfolded import reads exactly as a folded one; and for a model with any of
    :data:`VIEW_FEATURES`, its *circuit view* (:func:`circuit_view`, rotary QK circuits averaged
    over ``offsets``), whose weights hold what those features add to each circuit. Only the
    weights of the result are meant to be read: a circuit view's forward is not the model's. A lazy
    model's (:mod:`qkov.interop.lazy`) is a lazy model too, folded and viewed layer by layer."""
    if isinstance(model, LazyTransformer):
        return model.circuit(offsets)
    folded = fold(model).model if model.cfg.affine_norms else model
    if not any(feature in VIEW_FEATURES for feature in folded.cfg.features):
        return folded
    return circuit_view(folded, offsets)


def circuit_notes(cfg: Config) -> list[str]:
    """What the weight-based circuits of a model of ``cfg`` read, where a feature makes them depend
    on a choice (an offset) or exact only up to a per-position scale: one sentence each."""
    notes = {
        "rotary positions": "rotary positions: every QK circuit (spectra, skip-trigrams, Q/K-composition, "
        f"the induction check) is the mean over offsets {ANALYSIS_OFFSETS.start}-{ANALYSIS_OFFSETS.stop - 1} "
        "of W_Q R(offset) W_K^T, a key 1 to 64 tokens before the query "
        "(qkov.full_qk_circuit(model, offset=d) gives one offset; qkov.rotary_bands splits each head by "
        "frequency); OV circuits are exact",
        "query and key norms": "query and key norms: QK circuits hold the norms' gains and are exact up to "
        "each query's and each key's own positive scale",
        "norms after each sublayer": "norms after each sublayer: OV circuits and neuron values hold the "
        "norms' gains and are exact up to each position's positive scale of the layer's whole write",
        "attention soft-capping": "attention soft-capping: QK circuits give the scores before the cap",
        "logit soft-capping": "logit soft-capping: OV circuits and direct paths give the logits before "
        "the cap",
        "grouped-query attention": "grouped-query attention: each query head's circuits use its group's "
        "W_K and W_V",
    }
    return [notes[f] for f in cfg.features if f in notes]


def circuit_view(model: Transformer, offsets: range = ANALYSIS_OFFSETS) -> Transformer:
    """A folded model's circuit view: one query, key, value and output weight per head, each holding
    what a feature adds to it (the paper's QK circuit ``W_Q^T W_K``, ours ``W_Q W_K^T``, becomes
    ``W_Q G_q M W_K^T G_k / s``):

    - rotary positions: ``M``, the mean rotation over ``offsets`` (:func:`qkov.rotary.rotation`),
      so that ``W_Q M W_K^T`` is the mean QK circuit over those offsets, still of rank ``d_head``;
    - query and key norms: their gains ``G_q``, ``G_k`` (each query's and key's own scale stays out);
    - an attention scale ``s`` other than ``sqrt(d_head)``: in ``W_Q`` (``* sqrt(d_head) / s``), so that
      the circuits' ``1 / sqrt(d_head)`` gives the model's scores;
    - norms after a sublayer: their gain in ``W_O`` and ``b_O`` (``W_out``, ``b_out``);
    - grouped-query attention: ``W_K``, ``W_V`` repeated for every query head of a group.
    """
    # The tensors are read, not copied: model_from_tensors copies them into the view's own.
    state = {
        name: param.detach() for name, param in model.named_parameters() if not name.startswith("blocks.")
    }
    for layer, block in enumerate(model.blocks):
        state |= view_layer(model.cfg, layer, block, offsets)
    view = model_from_tensors(view_config(model.cfg), state, "circuit view")
    view.tokenizer = model.tokenizer
    return view


def view_config(cfg: Config) -> Config:
    """The config of a circuit view (:func:`circuit_view`): none of :data:`VIEW_FEATURES` left."""
    plain = dict(
        positional_embedding="none" if cfg.positional_embedding == "rotary" else cfg.positional_embedding,
        rotary_dim=None, rotary_interleaved=False, rotary_scaling=None, rotary_local_base=None,
        n_key_value_heads=None, qk_norm="none", pre_norms=True, post_norms=False, attn_scale=None,
        scale_attn_by_inverse_layer_idx=False,
    )  # fmt: skip
    return replace(cfg, **plain)


def view_layer(cfg: Config, layer: int, block, offsets: range = ANALYSIS_OFFSETS) -> dict[str, Tensor]:
    """One folded block's tensors in :func:`circuit_view`, by their names in the view (a lazy
    model views each layer as it reads it, by this same code; its MLP, read when first used, is not
    among them: :func:`gained` views it then). The block's tensors that the view keeps as they are
    are shared, not copied: the caller builds from them and drops the block."""
    prefix, skipped = f"blocks.{layer}.", ("_post.", "q_norm.", "k_norm.", "._W_", "._b_")
    state = {
        prefix + name: param.detach()
        for name, param in block.named_parameters()
        if not any(part in "." + name for part in skipped)
    }
    state |= _view_attention(cfg, layer, block.attn, offsets)
    gained(state, block.ln1_post, [prefix + "attn.W_O", prefix + "attn.b_O"])
    gained(state, block.ln2_post, [prefix + "mlp.W_out", prefix + "mlp.b_out"])
    return state


def gained(state: dict[str, Tensor], post, names: list[str]) -> None:
    """The circuit view's writes through a norm after their sublayer (``post``, or None): the
    tensors ``names`` that ``state`` holds, times its gain (a new tensor: the block's is shared)."""
    for name in names:
        if post is not None and name in state:
            state[name] = state[name] * post.w.detach()


def _view_attention(cfg: Config, layer: int, attn, offsets: range) -> dict[str, Tensor]:
    """One layer's query, key and value weights and biases in :func:`circuit_view`."""
    a, h, e = f"blocks.{layer}.attn.", cfg.n_heads, cfg.d_head
    W = {name: getattr(attn, name) for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")}
    W = {name: w.detach() for name, w in W.items() if w is not None}
    if attn.q_norm is not None:  # per head, or OLMo 2's over all heads: one gain per head dimension
        g_q, g_k = attn.q_norm.w.detach().reshape(-1, e), attn.k_norm.w.detach().reshape(-1, e)
        g_k = g_k.repeat_interleave(h // len(g_k), 0)
        W["W_Q"], W["W_K"] = W["W_Q"] * g_q[:, None, :], W["W_K"] * g_k[:, None, :]
        W |= {name: W[name] * g for name, g in (("b_Q", g_q), ("b_K", g_k)) if name in W}
    if attn.rotary is not None:
        mix = sum(rotation(cfg, d, layer) for d in offsets) / len(offsets)
        W |= {name: W[name] @ mix.to(W[name]) for name in ("W_Q", "b_Q") if name in W}
    factor = math.sqrt(e) / attn.scale
    W |= {name: W[name] * factor for name in ("W_Q", "b_Q") if name in W}
    return {a + name: w for name, w in W.items()}
