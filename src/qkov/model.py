"""A transformer in the paper's form (section "Transformer Overview"): attention-only by default,
with LayerNorm, MLPs and biases as options for GPT-2-style models.

Named axes, used identically in shapes, code and docs:

- ``batch``: independent sequences; ``pos``: a position in the sequence (``dest``/``src`` when a
  head reads from position ``src`` into position ``dest``);
- ``d_model``: the residual stream; ``n_heads`` x ``d_head``: the heads of one layer;
- ``d_vocab``: tokens; ``n_ctx``: the longest sequence the model accepts.

Conventions: row vectors, as in TransformerLens. The residual stream ``x`` has shape
``[..., d_model]`` and a head writes ``pattern @ x @ W_V @ W_O``; the paper, with column vectors,
writes ``W_O W_V x``. Weights carry TransformerLens' names and shapes (``W_E``, ``W_pos``,
``blocks.{l}.attn.W_Q`` ...), so they can move between the two libraries.

The residual stream is a sum (section "Residual Stream"): the embedding (plus positions in the
standard scheme) plus every head's write (plus every MLP's write and bias). :meth:`Transformer.run_with_cache`
returns each of those writes, and it can run with *frozen* attention patterns (section "OV and QK
Independence"): given the patterns, an attention-only model without LayerNorm is linear in its input,
which is what path expansion needs (with LayerNorm, :mod:`qkov.circuits.paths` also freezes each
position's LayerNorm scale, as the paper's appendix "Handling Layer Normalization" does).

GPT-2-style options (see :mod:`qkov.config`): with ``normalization="LN"`` each attention layer reads
``ln1(x)``, each MLP ``ln2(x)`` and the unembedding ``ln_final(x)``, where
``LN(x) = (x - mean(x)) / scale(x) * w + b`` and ``scale(x) = sqrt(var(x) + eps)`` (``"LNPre"``: the
same without ``w`` and ``b``, which were folded into the next weights). With ``d_mlp > 0`` every
block adds ``MLP(x) = act(x W_in + b_in) W_out + b_out`` after its attention layer (the paper's
``W_out act(W_in x)``).

:class:`AttnOnlyTransformer` is another name for :class:`Transformer`, the name the attention-only
model had before it grew these options; both name the same class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from qkov.cache import ActivationCache
from qkov.config import Config
from qkov.errors import QkovError
from qkov.hooks import HookFn, Hooks, Recorder, names_kept
from qkov.loss import row_losses, unembed_cross_entropy
from qkov.names import hook_name, hook_points, norm_name, scale_hook
from qkov.rotary import frequencies, rotate
from qkov.text import is_text, to_str_tokens, to_string, to_tokens

_GROUPED = ("W_K", "W_V", "b_K", "b_V")


class Attention(nn.Module):
    """One layer of ``n_heads`` independent, additive attention heads.

    Each head reads the residual stream through ``W_Q``, ``W_K`` (where to look: the QK circuit
    ``W_Q W_K^T``, the paper's ``W_Q^T W_K``) and ``W_V`` and writes through ``W_O`` (what to
    write: the OV circuit ``W_V W_O``, the paper's ``W_O W_V``). Scores are ``q . k / sqrt(d_head)``
    under a causal mask.
    """

    def __init__(self, cfg: Config, biases: bool = False, layer: int = 0) -> None:
        super().__init__()
        h, d, e, kv = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.n_kv_heads
        self.n_heads, self.d_head, self.n_kv_heads, self.layer = h, e, kv, layer
        self.cfg = cfg
        # grouped-query attention keeps one key and value head per group (TransformerLens' _W_K,
        # _W_V); W_K and W_V (properties) repeat them for every query head of the group
        prefix = "_" if kv != h else ""
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        setattr(self, prefix + "W_K", nn.Parameter(torch.empty(kv, d, e)))
        setattr(self, prefix + "W_V", nn.Parameter(torch.empty(kv, d, e)))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.b_Q = nn.Parameter(torch.zeros(h, e)) if biases else None
        for name in ("b_K", "b_V"):
            setattr(self, prefix + name, nn.Parameter(torch.zeros(kv, e)) if biases else None)
        self.b_O = nn.Parameter(torch.zeros(d)) if biases else None
        width = {"head": (e, e), "all": (h * e, kv * e)}.get(cfg.qk_norm)
        self.q_norm = RMSNorm(cfg, width[0], affine=True) if width else None
        self.k_norm = RMSNorm(cfg, width[1], affine=True) if width else None
        self.rotary = Rotary(cfg, layer) if cfg.positional_embedding == "rotary" else None

    @property
    def group_size(self) -> int:
        """How many query heads share one key and value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def __getattr__(self, name: str):
        """``W_K``, ``W_V``, ``b_K``, ``b_V`` per query head under grouped-query attention: the
        group's stored ``_W_K`` (...) repeated for every query head of the group."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name not in _GROUPED:
                raise
        shared = getattr(self, "_" + name)
        return None if shared is None else shared.repeat_interleave(self.group_size, dim=0)

    def kv_params(self, name: str) -> Tensor | None:
        """The stored key or value weight or bias (``"W_K"``, ``"b_V"``, ...): one per key/value head."""
        return getattr(self, name if self.n_kv_heads == self.n_heads else "_" + name)

    def qkv(
        self, x: Float[Tensor, "batch pos d_model"], qk_positions: Float[Tensor, "pos d_model"] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each ``[batch, n_heads, pos, d_head]`` (keys and values repeated
        over each group of query heads).

        Values read the stream ``x``; queries and keys read ``x + qk_positions`` (shortformer), computed
        as ``x @ W + qk_positions @ W`` so that all three projections are one matrix multiplication
        and the positions' share is computed once for the whole batch. Then, when the model has
        them, the query and key norms and the rotation by position.
        """
        h, kv = self.n_heads, self.n_kv_heads
        W = torch.cat(
            [rearrange(w, "n_heads d_model d_head -> d_model (n_heads d_head)")
             for w in (self.W_Q, self.kv_params("W_K"), self.kv_params("W_V"))], dim=1
        )  # fmt: skip
        sizes = [h * self.d_head, kv * self.d_head, kv * self.d_head]
        q, k, v = (x @ W).split(sizes, dim=-1)
        if qk_positions is not None:
            pos_q, pos_k = (qk_positions @ W[:, : sizes[0] + sizes[1]]).split(sizes[:2], dim=-1)
            q, k = q + pos_q, k + pos_k
        q, k, v = (
            rearrange(t, "batch pos (n d_head) -> batch n pos d_head", d_head=self.d_head) for t in (q, k, v)
        )
        if self.b_Q is not None:
            b_K, b_V = self.kv_params("b_K"), self.kv_params("b_V")
            q, k, v = q + self.b_Q[:, None, :], k + b_K[:, None, :], v + b_V[:, None, :]
        q, k = self._normed(q, self.q_norm), self._normed(k, self.k_norm)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        g = self.group_size
        return q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)

    def _normed(self, t: Float[Tensor, "batch n pos d_head"], norm: RMSNorm | None) -> Tensor:
        """A query or key norm: per head over ``d_head``, or over all heads at once (``qk_norm="all"``)."""
        if norm is None:
            return t
        if self.cfg.qk_norm == "head":
            return norm(t)
        n = t.shape[1]
        flat = rearrange(t, "batch n pos d_head -> batch pos (n d_head)")
        return rearrange(norm(flat), "batch pos (n d_head) -> batch n pos d_head", n=n)

    @property
    def scale(self) -> float:
        """What the scores ``q . k`` are divided by: ``attn_scale`` (default ``sqrt(d_head)``), times
        ``layer + 1`` with ``scale_attn_by_inverse_layer_idx``."""
        base = self.cfg.attn_scale if self.cfg.attn_scale is not None else math.sqrt(self.d_head)
        return base * (self.layer + 1 if self.cfg.scale_attn_by_inverse_layer_idx else 1)

    @property
    def plain(self) -> bool:
        """Whether the pattern is the softmax of ``q . k / scale`` under a causal mask alone (the fast
        path of :meth:`forward`)."""
        cfg = self.cfg
        return (
            cfg.attention_dir == "causal" and cfg.window(self.layer) is None and not cfg.attn_scores_soft_cap
        )

    def mask(self, n: int, device: torch.device) -> Bool[Tensor, "dest src"]:
        """Which sources each destination may read: ``src <= dest`` (causal), within the layer's
        sliding window (``dest - src < window``), or every position (bidirectional)."""
        dest, src = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
        allowed = torch.ones(n, n, dtype=torch.bool, device=device)
        if self.cfg.attention_dir == "causal":
            allowed &= src <= dest
        window = self.cfg.window(self.layer)
        if window is not None:
            allowed &= (dest - src) < window
        return allowed

    def scores(
        self, q: Float[Tensor, "batch n_heads dest d_head"], k: Float[Tensor, "batch n_heads src d_head"]
    ) -> Float[Tensor, "batch n_heads dest src"]:
        """The attention scores before the mask: ``q . k / scale``, soft-capped
        (``cap * tanh(s / cap)``) when the model says so."""
        scores = q @ k.transpose(-1, -2) / self.scale
        cap = self.cfg.attn_scores_soft_cap
        return scores if cap is None else cap * torch.tanh(scores / cap)

    def pattern(
        self, q: Float[Tensor, "batch n_heads dest d_head"], k: Float[Tensor, "batch n_heads src d_head"]
    ) -> Float[Tensor, "batch n_heads dest src"]:
        """The attention pattern: softmax over the allowed sources (:meth:`mask`) of :meth:`scores`."""
        scores = self.scores(q, k)
        allowed = self.mask(scores.shape[-1], scores.device)
        return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], qk_positions: Float[Tensor, "pos d_model"] | None
    ) -> Float[Tensor, "batch pos d_model"]:
        """The layer's total write to the residual stream (the fast path used in training)."""
        q, k, v = self.qkv(x, qk_positions)
        if self.plain:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / self.scale)
        else:
            z = self.pattern(q, k) @ v
        out = rearrange(z, "batch n_heads pos d_head -> batch pos (n_heads d_head)")
        out = out @ rearrange(self.W_O, "n_heads d_head d_model -> (n_heads d_head) d_model")
        return out if self.b_O is None else out + self.b_O

    def head_values(
        self,
        x: Float[Tensor, "batch pos d_model"],
        qk_positions: Float[Tensor, "pos d_model"] | None,
        pattern: Float[Tensor, "batch n_heads dest src"] | None = None,
        on_pattern: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Float[Tensor, "batch n_heads pos d_head"], Float[Tensor, "batch n_heads dest src"]]:
        """Every head's attention-weighted values ``z`` (TransformerLens' ``hook_z``; the write is
        ``z @ W_O``) and its pattern, frozen when ``pattern`` is given (:meth:`head_writes`);
        ``on_pattern(pattern)``, when given, sees the pattern and returns the one to use."""
        if pattern is None:
            q, k, v = self.qkv(x, qk_positions)
            pattern = self.pattern(q, k)
        else:  # frozen attention: only the values are needed
            v = einsum(x, self.W_V, "batch pos d_model, n_heads d_model d_head -> batch n_heads pos d_head")
            v = v if self.b_V is None else v + self.b_V[:, None, :]
        if on_pattern is not None:
            pattern = on_pattern(pattern)
        z = einsum(
            pattern, v, "batch n_heads dest src, batch n_heads src d_head -> batch n_heads dest d_head"
        )
        return z, pattern

    def layer_write(
        self, x: Float[Tensor, "batch pos d_model"], pattern: Float[Tensor, "batch n_heads dest src"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """:meth:`head_writes` with ``pattern`` frozen, summed over the heads (``b_O`` excluded), in one
        product with the heads' ``W_O`` stacked instead of a write per head."""
        z, _ = self.head_values(x, None, pattern)
        out = rearrange(self.W_O, "n_heads d_head d_model -> (n_heads d_head) d_model")
        return rearrange(z, "batch n_heads pos d_head -> batch pos (n_heads d_head)") @ out

    def head_writes(
        self,
        x: Float[Tensor, "batch pos d_model"],
        qk_positions: Float[Tensor, "pos d_model"] | None,
        pattern: Float[Tensor, "batch n_heads dest src"] | None = None,
    ) -> tuple[Float[Tensor, "batch pos n_heads d_model"], Float[Tensor, "batch n_heads dest src"]]:
        """Every head's write to the residual stream and its attention pattern.

        With ``pattern`` given (frozen attention), the queries and keys are not used and the
        write is linear in ``x``. ``b_O`` belongs to no head and is not included.
        """
        z, pattern = self.head_values(x, qk_positions, pattern)
        writes = einsum(
            z, self.W_O, "batch n_heads pos d_head, n_heads d_head d_model -> batch pos n_heads d_model"
        )
        return writes, pattern


class LayerNorm(nn.Module):
    """LayerNorm with TransformerLens' names: ``LN(x) = (x - mean(x)) / scale(x) * w + b`` over
    ``d_model``, ``scale(x) = sqrt(mean((x - mean(x))^2) + eps)``. Without ``w`` and ``b`` (``"LNPre"``)
    it only centres and divides by the scale (appendix "Handling Layer Normalization": the weight
    and bias fold into the next linear map, the scale does not)."""

    centre = True

    def __init__(self, cfg: Config, width: int | None = None, affine: bool | None = None) -> None:
        super().__init__()
        self.eps = cfg.ln_eps
        width = width or cfg.d_model
        affine = cfg.affine_norms if affine is None else affine
        self.w = nn.Parameter(torch.ones(width)) if affine else None
        self.b = nn.Parameter(torch.zeros(width)) if affine and self.centre else None

    def _centred(self, x: Tensor) -> Tensor:
        return x - x.mean(-1, keepdim=True) if self.centre else x

    def scale(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... 1"]:
        return (self._centred(x).square().mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]) -> Tensor:
        """The linear part with the scale given (frozen): ``(x - mean(x)) / scale * w``, no ``b``."""
        out = self._centred(x) / scale
        return out if self.w is None else out * self.w

    def linear_adjoint(self, y: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]) -> Tensor:
        """The adjoint of :meth:`linear` (the scale frozen): ``<linear(x), y> = <x, linear_adjoint(y)>``
        over the last axis, each position's scale its own. Centring is symmetric and the scale and
        ``w`` diagonal, so it is ``(y * w / scale) - mean``, the same operations in reverse order."""
        out = y / scale if self.w is None else y * self.w / scale
        return self._centred(out)

    def forward(
        self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"] | None = None
    ) -> Float[Tensor, "... d_model"]:
        """``LN(x)``; with ``scale`` given (frozen), affine in ``x``."""
        out = self.linear(x, self.scale(x) if scale is None else scale)
        return out if self.b is None else out + self.b


class RMSNorm(LayerNorm):
    """RMSNorm: ``x / scale(x) * w`` with ``scale(x) = sqrt(mean(x^2) + eps)``, no centring and no
    bias (Llama, Gemma with its ``1 + w`` already added, Qwen, OLMo). TransformerLens' ``RMS`` and,
    without ``w``, ``RMSPre``: only the per-position scale stays when ``w`` is folded."""

    centre = False


def make_norm(cfg: Config, width: int | None = None, affine: bool | None = None) -> LayerNorm:
    """The model's kind of norm (LayerNorm or RMSNorm) over ``width`` (default ``d_model``)."""
    return (RMSNorm if cfg.is_rms else LayerNorm)(cfg, width, affine)


class Rotary(nn.Module):
    """Rotary positions for one layer (:mod:`qkov.rotary`): rotates queries or keys by position."""

    def __init__(self, cfg: Config, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("freqs", frequencies(cfg, layer), persistent=False)

    def forward(self, x: Float[Tensor, "batch n pos d_head"], start: int = 0) -> Tensor:
        positions = torch.arange(start, start + x.shape[-2], dtype=torch.float64, device=x.device)
        return rotate(x, positions[:, None] * self.freqs.to(x.device, torch.float64)[None, :], self.cfg)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


class MLP(nn.Module):
    """A position-wise MLP: ``act(x W_in + b_in) W_out + b_out`` (the paper, column vectors:
    ``W_out act(W_in x)``), ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``. Gated
    (``gated_mlp``, SwiGLU and GeGLU): ``(act(x W_gate) * (x W_in + b_in)) W_out + b_out``."""

    def __init__(self, cfg: Config, biases: bool = False) -> None:
        super().__init__()
        self.act = ACTIVATIONS[cfg.act_fn]
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp)) if cfg.gated_mlp else None
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if biases else None
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp)) if biases and cfg.gated_mlp else None
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if biases else None

    def post(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_mlp"]:
        """The neurons' activations (TransformerLens' ``hook_post``)."""
        pre = x @ self.W_in
        pre = pre if self.b_in is None else pre + self.b_in
        if self.W_gate is None:
            return self.act(pre)
        gate = x @ self.W_gate
        return self.act(gate if self.b_gate is None else gate + self.b_gate) * pre

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        out = self.post(x) @ self.W_out
        return out if self.b_out is None else out + self.b_out


def normalized(ln: LayerNorm | None, x: Tensor) -> Tensor:
    """``ln(x)``, or ``x`` itself in a model without LayerNorm."""
    return x if ln is None else ln(x)


class Block(nn.Module):
    """A residual block: an attention layer (reading ``ln1(x)`` when the model has LayerNorm) and,
    when ``d_mlp > 0``, an MLP (reading ``ln2(x)``). The paper's models have neither norm nor MLP.
    With ``post_norms`` each sublayer's write passes through its own norm (``ln1_post``,
    ``ln2_post``) before joining the stream; with ``parallel_attn_mlp`` both read the block's input."""

    def __init__(self, cfg: Config, biases: bool = False, layer: int = 0) -> None:
        super().__init__()
        pre, post = cfg.has_layer_norm and cfg.pre_norms, cfg.has_layer_norm and cfg.post_norms
        self.parallel = cfg.parallel_attn_mlp
        self.ln1 = make_norm(cfg) if pre else None
        self.attn = Attention(cfg, biases, layer)
        self.ln1_post = make_norm(cfg, affine=True) if post else None
        self.ln2 = make_norm(cfg) if pre and cfg.has_mlp else None
        self.mlp = MLP(cfg, biases) if cfg.has_mlp else None
        self.ln2_post = make_norm(cfg, affine=True) if post and cfg.has_mlp else None

    def forward(
        self, resid: Float[Tensor, "batch pos d_model"], qk_positions: Tensor | None
    ) -> Float[Tensor, "batch pos d_model"]:
        """The stream after the block (the fast path: no per-head writes are kept)."""
        attn_out = normalized(self.ln1_post, self.attn(normalized(self.ln1, resid), qk_positions))
        if self.mlp is None:
            return resid + attn_out
        mid = resid + attn_out
        mlp_in = resid if self.parallel else mid
        return mid + normalized(self.ln2_post, self.mlp(normalized(self.ln2, mlp_in)))


class Transformer(nn.Module):
    """A transformer with TransformerLens weight names (see the module docstring).

    ``model(tokens)`` returns logits ``[batch, pos, d_vocab]``. Biases are absent by default (the
    paper's models have none); ``biases=True`` adds ``b_Q``, ``b_K``, ``b_V``, ``b_O`` to every
    layer, ``b_in`` and ``b_out`` to every MLP, and ``b_U``, initialised to zero. LayerNorm (``ln1``,
    ``ln2``, ``ln_final``) and MLPs follow ``cfg.normalization`` and ``cfg.d_mlp``. With
    ``init=False`` the weights are left uninitialised, for a caller that copies every one of them.
    """

    def __init__(self, cfg: Config, biases: bool = False, init: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model)) if cfg.has_positions else None
        self.blocks = nn.ModuleList(Block(cfg, biases, layer) for layer in range(cfg.n_layers))
        self.ln_final = make_norm(cfg) if cfg.has_layer_norm else None
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_out))  # d_vocab unless d_vocab_out says
        self.b_U = nn.Parameter(torch.zeros(cfg.d_out)) if biases else None
        self.tokenizer = None  # a tokenizers.Tokenizer, set by qkov.load when the checkpoint has one
        if init:  # skipped by whoever fills every weight next (loading a checkpoint: seconds at GPT-2 size)
            init_weights(self, torch.Generator().manual_seed(0))

    @property
    def device(self) -> torch.device:
        """Where the weights are (every analysis computes there)."""
        return self.W_E.device

    def outer_factors(self) -> tuple[Float[Tensor, "d_vocab d_model"], Float[Tensor, "d_model d_out"]]:
        """``W_E`` and ``W_U`` as the full circuits read them (section "Summarizing OV/QK Matrices":
        the shared outer factors of :class:`~qkov.linalg.SharedFactoredMatrix`): the parameters
        themselves; a lazy model whose ends are held narrow gives :class:`~qkov.tall.TallMatrix`
        ones, read a block of rows at a time."""
        return self.W_E, self.W_U

    @property
    def has_biases(self) -> bool:
        return self.b_U is not None

    def check_tokens(self, tokens: Tensor, max_pos: int | None = None) -> Int[Tensor, "batch pos"]:
        """Validate a batch of token ids (at most ``max_pos``, default ``n_ctx``, per sequence),
        with a clear error for what does not fit the model, and move it to the model's device.
        Text (a string or a list of strings) is read through :meth:`to_tokens` first."""
        max_pos = max_pos or self.cfg.n_ctx
        if is_text(tokens):
            tokens = self.to_tokens(tokens)
        if not isinstance(tokens, Tensor):
            tokens = torch.as_tensor(tokens)
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise QkovError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise QkovError(f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}")
        if tokens.shape[1] > max_pos:
            raise QkovError(
                f"sequence of {tokens.shape[1]} tokens is longer than the context (n_ctx={self.cfg.n_ctx})"
            )
        # (not while torch.compile traces the training step: reading the range would break its graph)
        in_range = torch.compiler.is_compiling() or not tokens.numel()
        if not in_range and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.d_vocab):
            raise QkovError(
                f"token ids must lie in [0, {self.cfg.d_vocab}), got range "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        return tokens.long().to(self.device)

    def _tokenizer(self):
        if self.tokenizer is None:
            raise QkovError(
                "this model has no tokenizer (its folder has no tokenizer.json): pass token ids, "
                "or set model.tokenizer to a tokenizers.Tokenizer"
            )
        return self.tokenizer

    def to_tokens(
        self, text: str | Sequence[str], prepend_bos: bool | None = None
    ) -> Int[Tensor, "batch pos"]:
        """Text as token ids ``[batch, pos]`` on the model's device, as TransformerLens' ``to_tokens``
        (a list of strings is padded on the right); ``prepend_bos`` None: a start token exactly when
        the model was trained with one (``cfg.bos_token_id``), see :mod:`qkov.text`."""
        return to_tokens(self._tokenizer(), self.cfg, text, prepend_bos).to(self.device)

    def to_str_tokens(self, tokens, prepend_bos: bool | None = None) -> list[str] | list[list[str]]:
        """Each token of ``tokens`` (text or ids) as it reads (:func:`qkov.text.to_str_tokens`)."""
        return to_str_tokens(self._tokenizer(), self.cfg, tokens, prepend_bos)

    def to_string(self, tokens) -> str | list[str]:
        """Token ids back to text: a string for one sequence, a list for a batch."""
        return to_string(self._tokenizer(), tokens)

    def embed(
        self, tokens: Int[Tensor, "batch pos"]
    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "pos d_model"] | None]:
        """The residual stream's start and the positions each layer adds to its Q/K inputs.

        Returns ``(resid, qk_positions)``: ``resid = W_E[tokens]`` (plus ``W_pos[:pos]`` for the
        standard scheme) and ``qk_positions = W_pos[:pos]`` for shortformer, else None.

        ``F.embedding`` rather than indexing: its CPU backward gives each thread a range of ``W_E``'s
        rows and sums each row's gradients in token order, so ``W_E``'s gradient is the same bits on
        every run; indexing's backward (``index_put_`` with accumulate) adds rows from several
        threads in a varying order, which made two same-seed 2-thread runs differ.
        """
        resid = F.embedding(tokens, self.W_E)
        if self.W_pos is None:
            return resid, None
        positions = self.W_pos[: tokens.shape[1]]
        if self.cfg.positional_embedding == "standard":
            return resid + positions, None
        return resid, positions

    def unembed(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits of a final residual stream: ``ln_final(resid) @ W_U + b_U`` (soft-capped,
        ``cap * tanh(logits / cap)``, when the model says so)."""
        return self._logits(normalized(self.ln_final, resid))

    def _logits(self, normed: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        """The logits of the stream after ``ln_final``: ``normed @ W_U + b_U``, soft-capped."""
        logits = normed @ self.W_U
        return self.soft_capped(logits if self.b_U is None else logits + self.b_U)

    @torch.no_grad()
    def stream_losses(
        self, resid: Float[Tensor, "batch pos d_model"], targets: Int[Tensor, "batch pos"], buffer: Tensor
    ) -> Float[Tensor, "batch pos"]:
        """``token_losses(self.unembed(resid), targets)``, the logits formed in ``buffer``
        (:func:`qkov.loss.logit_buffer`) a block of positions at a time: for a run read only for its
        losses, repeated (no logits tensor of the whole batch, fresh each time). No gradient."""
        normed = normalized(self.ln_final, resid).flatten(0, 1)
        cap = self.cfg.output_logits_soft_cap
        return row_losses(normed, self.W_U, self.b_U, targets.flatten(), buffer, cap).view(targets.shape)

    def soft_capped(self, logits: Float[Tensor, "... d_vocab"]) -> Float[Tensor, "... d_vocab"]:
        """The final-logit soft-cap (Gemma 2): ``cap * tanh(logits / cap)``; the logits themselves
        without one."""
        cap = self.cfg.output_logits_soft_cap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def residual(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The final residual stream, before ``ln_final`` (the fast path: no per-head writes are kept)."""
        resid, qk_positions = self.embed(tokens)
        for block in self.blocks:
            resid = block(resid, qk_positions)
        return resid

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.unembed(self.residual(self.check_tokens(tokens)))

    def loss(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]``
        (so up to ``n_ctx + 1`` tokens per sequence), with the unembedding fused into the loss
        (no full logits tensor; see :mod:`qkov.loss`)."""
        tokens = self.check_tokens(tokens, max_pos=self.cfg.n_ctx + 1)
        if self.cfg.output_logits_soft_cap is not None:  # the fused loss has no soft-cap
            logits = self.unembed(self.residual(tokens[:, :-1]))
            return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        resid = normalized(self.ln_final, self.residual(tokens[:, :-1]))
        return unembed_cross_entropy(resid.flatten(0, 1), self.W_U, self.b_U, tokens[:, 1:].flatten())

    def run_with_cache(
        self,
        tokens: Int[Tensor, "batch pos"] | str | Sequence[str],
        patterns: Sequence[Float[Tensor, "batch n_heads dest src"]] | None = None,
        edit_writes: Callable[[int, Tensor], Tensor] | None = None,
        start: tuple[int, Float[Tensor, "runs pos d_model"]] | None = None,
        fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = (),
        names_filter: str | Sequence[str] | Callable[[str], bool] | None = None,
        return_type: str | None = "logits",
    ) -> tuple[Float[Tensor, "batch pos d_vocab"] | None, ActivationCache]:
        """Logits and every activation, under TransformerLens' hook names (section "Residual Stream":
        the final stream is the start of the stream plus every layer's write).

        The cache (:class:`qkov.cache.ActivationCache`, a dict that also reads TransformerLens'
        short keys, ``cache["pattern", 1]``) holds ``hook_embed`` (``W_E[tokens]``), ``hook_pos_embed``
        (``W_pos[:pos]`` for every sequence, when the model has positions), and per layer ``l``:
        ``blocks.{l}.hook_resid_pre``, ``blocks.{l}.attn.hook_pattern`` ``[batch, n_heads, dest, src]``,
        ``blocks.{l}.attn.hook_z`` ``[batch, pos, n_heads, d_head]``, ``blocks.{l}.attn.hook_result``
        (every head's write, ``[batch, pos, n_heads, d_model]``), ``blocks.{l}.hook_attn_out`` (their
        sum plus ``b_O``) and ``blocks.{l}.hook_resid_post``. With MLPs, also
        ``blocks.{l}.hook_resid_mid`` (after attention) and ``blocks.{l}.hook_mlp_out`` (the MLP's
        write, ``b_out`` included); with LayerNorm, each norm's scale ``[batch, pos, 1]``:
        ``blocks.{l}.ln1.hook_scale``, ``blocks.{l}.ln2.hook_scale`` and ``ln_final.hook_scale``.
        :func:`qkov.names.hook_points` lists them in the order the run reaches them.

        ``patterns``, one per layer, freezes the attention: the given patterns are used instead of
        the ones the queries and keys would give, and a model without LayerNorm or MLPs is then
        linear in its input (affine with biases).

        ``edit_writes(layer, writes)``, when given, replaces each layer's head writes
        ``[batch, pos, n_heads, d_model]`` before they join the stream (ablations); the cache holds
        the edited writes.

        ``start=(layer, resid)`` resumes a run at ``layer`` from ``resid``, the residual stream entering
        it in an earlier run on ``tokens`` (its ``hook_resid_pre``), or several such streams stacked
        along the batch (``[runs * batch, pos, d_model]``, e.g. one per ablation): the layers before it
        are not run and not in the cache, and logits and cache have ``resid``'s batch.

        ``fwd_hooks``: TransformerLens' ``(name or filter, fn)`` pairs (:mod:`qkov.hooks`), each
        ``fn(activation, hook)`` returning the activation to use from there on, or None.

        ``names_filter``: which activations the cache keeps, as TransformerLens takes it (a hook
        name, a list of them, or ``filter(name) -> bool``; None: every one; a name that is no hook
        point is an error, where TransformerLens keeps nothing for it). The run and its logits are
        the same; a run that reads only the patterns, say, does not hold every head's write.

        ``return_type``: ``"logits"``, or None (as TransformerLens takes it, for a run that reads
        only its cache): no unembedding, and None in the logits' place (``ln_final.hook_scale`` is
        still recorded). TransformerLens' ``"loss"`` and ``"both"`` are :meth:`loss`'s here.
        """
        if return_type not in ("logits", None):
            raise QkovError(f'return_type: "logits" or None, not {return_type!r} (the loss: model.loss)')
        points = hook_points(self.cfg)
        hooks = Hooks(fwd_hooks, points) if fwd_hooks else None
        record = Recorder(hooks, names_kept(names_filter, points))
        unembed = return_type is not None
        logits = self._run(self.check_tokens(tokens), patterns, edit_writes, start, record, unembed)
        return logits, ActivationCache(record.cache, self.cfg, self.ln_final)

    def run_with_hooks(
        self,
        tokens: Int[Tensor, "batch pos"] | str | Sequence[str],
        fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = (),
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """The logits of a run with ``fwd_hooks`` (TransformerLens' ``run_with_hooks``): pairs of a
        hook name (:func:`qkov.names.hook_points`) or a filter ``filter(name) -> bool`` and a function
        ``fn(activation, hook)`` that returns the activation to use from there on (activation
        patching), or None to keep it (``hook.name`` is the point's name). With hooks that return
        None, the logits are :meth:`run_with_cache`'s, bit for bit. Nothing is cached: each head's
        write, for one, is formed only where a hook reads it."""
        return self.run_with_cache(tokens, fwd_hooks=fwd_hooks, names_filter=[])[0]

    def block_with_hooks(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        qk_positions: Tensor | None,
        fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = (),
    ) -> Float[Tensor, "batch pos d_model"]:
        """The stream after block ``layer`` from ``resid``, the stream entering it (its
        ``hook_resid_pre``; ``qk_positions`` from :meth:`embed`), with ``fwd_hooks`` as
        :meth:`run_with_cache` takes them and nothing cached: one block of that run, for a caller
        that goes a layer at a time (a backward pass that holds one layer's graph)."""
        points = hook_points(self.cfg)
        record = Recorder(Hooks(fwd_hooks, points) if fwd_hooks else None, names_kept([], points))
        return self._block_with_cache(layer, resid, qk_positions, None, None, record)

    def _run(
        self,
        tokens: Int[Tensor, "batch pos"],
        patterns: Sequence[Tensor] | None,
        edit_writes: Callable[[int, Tensor], Tensor] | None,
        start: tuple[int, Tensor] | None,
        record: Recorder,
        unembed: bool,
    ) -> Float[Tensor, "batch pos d_vocab"] | None:
        """:meth:`run_with_cache`'s forward: every activation through ``record``, the logits out
        (None without ``unembed``)."""
        if patterns is not None and len(patterns) != self.cfg.n_layers:
            raise QkovError(f"expected {self.cfg.n_layers} frozen patterns, got {len(patterns)}")
        resid, qk_positions = self._embed_with_cache(tokens, record, start is None)
        first = 0
        if start is not None:
            first, resid = start
        for layer in range(first, self.cfg.n_layers):
            frozen = None if patterns is None else patterns[layer]
            resid = self._block_with_cache(layer, resid, qk_positions, frozen, edit_writes, record)
        normed = self._norm(self.ln_final, resid, record, norm_name(None, "ln_final"))
        return self._logits(normed) if unembed else None

    def _embed_with_cache(
        self, tokens: Int[Tensor, "batch pos"], record: Recorder, with_embed: bool
    ) -> tuple[Float[Tensor, "batch pos d_model"], Tensor | None]:
        """:meth:`embed`, with ``hook_embed`` (when ``with_embed``) and ``hook_pos_embed`` through
        ``record`` (the positions copied when hooked, so that no hook can write into ``W_pos``)."""
        embed = F.embedding(tokens, self.W_E)
        if with_embed:
            embed = record("hook_embed", embed)
        if self.W_pos is None:
            return embed, None
        positions = self.W_pos[: tokens.shape[1]]
        hooked = record.hooked("hook_pos_embed")
        pos = positions.expand(tokens.shape[0], -1, -1)
        pos = record("hook_pos_embed", pos.clone() if hooked else pos)
        if self.cfg.positional_embedding == "standard":
            return embed + pos, None
        return embed, pos if hooked else positions

    def _block_with_cache(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        qk_positions: Tensor | None,
        frozen: Tensor | None,
        edit_writes: Callable[[int, Tensor], Tensor] | None,
        record: Recorder,
    ) -> Float[Tensor, "batch pos d_model"]:
        """One block of :meth:`run_with_cache`: its activations through ``record``, the stream after
        it out."""
        block = self.blocks[layer]
        resid = record(hook_name(layer, "resid_pre"), resid)
        attn_in = self._norm(block.ln1, resid, record, norm_name(layer, "ln1"))
        attn_out = self._attention_with_cache(layer, attn_in, qk_positions, frozen, edit_writes, record)
        mid = resid + attn_out
        if block.mlp is None:
            return record(hook_name(layer, "resid_post"), mid)
        mid = record(hook_name(layer, "resid_mid"), mid)
        mlp_in = self._norm(block.ln2, resid if block.parallel else mid, record, norm_name(layer, "ln2"))
        mlp_out = self._norm(block.ln2_post, block.mlp(mlp_in), record, norm_name(layer, "ln2_post"))
        return record(hook_name(layer, "resid_post"), mid + record(hook_name(layer, "mlp_out"), mlp_out))

    def _attention_with_cache(
        self,
        layer: int,
        x: Float[Tensor, "batch pos d_model"],
        qk_positions: Tensor | None,
        frozen: Tensor | None,
        edit_writes: Callable[[int, Tensor], Tensor] | None,
        record: Recorder,
    ) -> Float[Tensor, "batch pos d_model"]:
        """One attention layer of :meth:`run_with_cache`: pattern, ``z``, head writes and the layer's
        whole write (``attn_out``, returned) through ``record``."""
        block = self.blocks[layer]
        on_pattern = partial(record, hook_name(layer, "pattern"))
        z, _ = block.attn.head_values(x, qk_positions, frozen, on_pattern)
        z = record(hook_name(layer, "z"), z.transpose(1, 2))
        result = hook_name(layer, "result")
        if edit_writes is not None:
            return self._edited(layer, z, edit_writes, record)
        out, scale = self._summed(layer, z, record)
        if record.wants(result):  # each head's write formed only to be read (see _summed)
            writes = self._head_writes(layer, z)
            writes = writes if scale is None else block.ln1_post.linear(writes, scale[..., None, :])
            hooked = record.hooked(result)
            before = writes.clone() if hooked else writes  # a hook may change it in place
            after = record(result, writes)
            if hooked:  # the layer's write moves by what the hooks changed: by 0 if nothing
                out = out + (after - before).sum(dim=2)
        return record(hook_name(layer, "attn_out"), out)

    def _edited(
        self,
        layer: int,
        z: Float[Tensor, "batch pos n_heads d_head"],
        edit_writes: Callable[[int, Tensor], Tensor],
        record: Recorder,
    ) -> Float[Tensor, "batch pos d_model"]:
        """The layer's write with its heads' writes as ``edit_writes`` changes them (before the norm
        after the attention, when the model has one: its scale is the edited write's), through
        ``record`` (``hook_result``, the norm's scale)."""
        block = self.blocks[layer]
        writes = edit_writes(layer, self._head_writes(layer, z))
        bias = block.attn.b_O
        if block.ln1_post is not None:  # the norm of the layer's whole write, split over its heads
            total = writes.sum(dim=2) if bias is None else writes.sum(dim=2) + bias
            scale = record(scale_hook(norm_name(layer, "ln1_post")), block.ln1_post.scale(total))
            writes = block.ln1_post.linear(writes, scale[..., None, :])
            bias = block.ln1_post(torch.zeros_like(total) if bias is None else bias.expand_as(total), scale)
        writes = record(hook_name(layer, "result"), writes)
        out = writes.sum(dim=2)
        return record(hook_name(layer, "attn_out"), out if bias is None else out + bias)

    def _head_writes(
        self, layer: int, z: Float[Tensor, "batch pos n_heads d_head"]
    ) -> Float[Tensor, "batch pos n_heads d_model"]:
        W_O = self.blocks[layer].attn.W_O
        return einsum(z, W_O, "batch pos n_heads d_head, n_heads d_head d_model -> batch pos n_heads d_model")

    def _summed(
        self, layer: int, z: Float[Tensor, "batch pos n_heads d_head"], record: Recorder
    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos 1"] | None]:
        """Layer ``layer``'s whole write (``attn_out``) from its heads' ``z`` in one product with the
        heads' ``W_O`` stacked, and the scale of the norm after the attention (None without one).
        Every head's write (``[batch, pos, n_heads, d_model]``, 272 MiB a layer at Llama-3.2-1B's
        shapes on 8 x 130 tokens) is formed only when the cache keeps it or a hook reads it:
        forming and summing it cost more than the product. The same write as their sum, to float
        rounding (the norm is linear in the write once its scale is taken), and the same bits
        whatever the cache keeps and whichever hooks leave it as it is."""
        attn, post = self.blocks[layer].attn, self.blocks[layer].ln1_post
        total = rearrange(z, "batch pos n_heads d_head -> batch pos (n_heads d_head)") @ rearrange(
            attn.W_O, "n_heads d_head d_model -> (n_heads d_head) d_model"
        )
        total = total if attn.b_O is None else total + attn.b_O
        if post is None:
            return total, None
        scale = record(scale_hook(norm_name(layer, "ln1_post")), post.scale(total))
        return post(total, scale), scale

    @staticmethod
    def _norm(ln: LayerNorm | None, x: Tensor, record: Recorder, name: str) -> Tensor:
        """``ln(x)``, with its scale through ``record`` as ``{name}.hook_scale``."""
        if ln is None:
            return x
        return ln(x, record(scale_hook(name), ln.scale(x)))


def sinusoidal_positions(n_ctx: int, d_model: int) -> Float[Tensor, "n_ctx d_model"]:
    """Sinusoids (Vaswani et al.) scaled to unit variance per entry: the ``W_pos`` initialisation."""
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return (table * math.sqrt(2.0)).float()


AttnOnlyTransformer = Transformer  # the attention-only default's name, kept for existing code


@torch.no_grad()
def init_weights(model: Transformer, generator: torch.Generator) -> None:
    """An initialisation that keeps the residual stream O(1) without LayerNorm.

    Measured here: GPT-2's N(0, 0.02) leaves attention exactly uniform for hundreds of steps in an
    attention-only model with no LayerNorm. Instead ``W_E ~ N(0, 1)``; ``W_pos`` = unit-variance
    sinusoids (previous-token heads form 2-3x sooner than from random positions);
    ``W_Q, W_K, W_V ~ N(0, 1/d_model)``; ``W_O ~ N(0, 1/(n_heads d_head n_layers))``;
    ``W_U ~ N(0, 1/d_model^2)``; biases zero. With MLPs, ``W_in ~ N(0, 1/d_model)`` and
    ``W_out ~ N(0, 1/(d_mlp n_layers))``, drawn after each layer's attention weights (so an
    attention-only model draws exactly what it always did); LayerNorm ``w = 1``, ``b = 0``.
    """
    cfg = model.cfg

    def normal_(param: Tensor, std: float) -> None:
        param.copy_(torch.randn(param.shape, generator=generator, device=generator.device) * std)

    normal_(model.W_E, 1.0)
    if model.W_pos is not None:
        model.W_pos.copy_(sinusoidal_positions(cfg.n_ctx, cfg.d_model))
    for block in model.blocks:
        for W in (block.attn.W_Q, block.attn.kv_params("W_K"), block.attn.kv_params("W_V")):
            normal_(W, cfg.d_model**-0.5)
        normal_(block.attn.W_O, (cfg.n_heads * cfg.d_head * cfg.n_layers) ** -0.5)
        if block.mlp is not None:
            if block.mlp.W_gate is not None:
                normal_(block.mlp.W_gate, cfg.d_model**-0.5)
            normal_(block.mlp.W_in, cfg.d_model**-0.5)
            normal_(block.mlp.W_out, (cfg.d_mlp * cfg.n_layers) ** -0.5)
    normal_(model.W_U, 1.0 / cfg.d_model)
    for name, param in model.named_parameters():
        short = name.rsplit(".", 1)[-1]
        if short.startswith("b_") or short == "b":
            param.zero_()
        elif short == "w":
            param.fill_(1.0)
