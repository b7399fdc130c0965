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

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from qkov.config import Config
from qkov.errors import QkovError
from qkov.loss import unembed_cross_entropy
from qkov.names import hook_name, norm_name, scale_hook


class Attention(nn.Module):
    """One layer of ``n_heads`` independent, additive attention heads.

    Each head reads the residual stream through ``W_Q``, ``W_K`` (where to look: the QK circuit
    ``W_Q W_K^T``, the paper's ``W_Q^T W_K``) and ``W_V`` and writes through ``W_O`` (what to
    write: the OV circuit ``W_V W_O``, the paper's ``W_O W_V``). Scores are ``q . k / sqrt(d_head)``
    under a causal mask.
    """

    def __init__(self, cfg: Config, biases: bool = False) -> None:
        super().__init__()
        h, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.n_heads, self.d_head = h, e
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        self.W_K = nn.Parameter(torch.empty(h, d, e))
        self.W_V = nn.Parameter(torch.empty(h, d, e))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        if biases:
            self.b_Q = nn.Parameter(torch.zeros(h, e))
            self.b_K = nn.Parameter(torch.zeros(h, e))
            self.b_V = nn.Parameter(torch.zeros(h, e))
            self.b_O = nn.Parameter(torch.zeros(d))
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None

    def qkv(
        self, x: Float[Tensor, "batch pos d_model"], qk_positions: Float[Tensor, "pos d_model"] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each ``[batch, n_heads, pos, d_head]``.

        Values read the stream ``x``; queries and keys read ``x + qk_positions`` (shortformer), computed
        as ``x @ W + qk_positions @ W`` so that all three projections are one matrix multiplication
        and the positions' share is computed once for the whole batch.
        """
        h = self.n_heads
        W = rearrange(
            torch.stack([self.W_Q, self.W_K, self.W_V]),
            "k n_heads d_model d_head -> d_model (k n_heads d_head)",
        )
        q, k, v = rearrange(
            x @ W, "batch pos (k n_heads d_head) -> k batch n_heads pos d_head", k=3, n_heads=h
        ).unbind(0)
        if qk_positions is not None:
            pos_q, pos_k = rearrange(
                qk_positions @ W[:, : 2 * h * self.d_head],
                "pos (k n_heads d_head) -> k n_heads pos d_head",
                k=2,
                n_heads=h,
            ).unbind(0)
            q, k = q + pos_q, k + pos_k
        if self.b_Q is not None:
            q, k, v = q + self.b_Q[:, None, :], k + self.b_K[:, None, :], v + self.b_V[:, None, :]
        return q, k, v

    def pattern(
        self, q: Float[Tensor, "batch n_heads dest d_head"], k: Float[Tensor, "batch n_heads src d_head"]
    ) -> Float[Tensor, "batch n_heads dest src"]:
        """The attention pattern: softmax over ``src <= dest`` of ``q . k / sqrt(d_head)``."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], qk_positions: Float[Tensor, "pos d_model"] | None
    ) -> Float[Tensor, "batch pos d_model"]:
        """The layer's total write to the residual stream (the fast path used in training)."""
        q, k, v = self.qkv(x, qk_positions)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = rearrange(z, "batch n_heads pos d_head -> batch pos (n_heads d_head)")
        out = out @ rearrange(self.W_O, "n_heads d_head d_model -> (n_heads d_head) d_model")
        return out if self.b_O is None else out + self.b_O

    def head_values(
        self,
        x: Float[Tensor, "batch pos d_model"],
        qk_positions: Float[Tensor, "pos d_model"] | None,
        pattern: Float[Tensor, "batch n_heads dest src"] | None = None,
    ) -> tuple[Float[Tensor, "batch n_heads pos d_head"], Float[Tensor, "batch n_heads dest src"]]:
        """Every head's attention-weighted values ``z`` (TransformerLens' ``hook_z``; the write is
        ``z @ W_O``) and its pattern, frozen when ``pattern`` is given (:meth:`head_writes`)."""
        if pattern is None:
            q, k, v = self.qkv(x, qk_positions)
            pattern = self.pattern(q, k)
        else:  # frozen attention: only the values are needed
            v = einsum(x, self.W_V, "batch pos d_model, n_heads d_model d_head -> batch n_heads pos d_head")
            v = v if self.b_V is None else v + self.b_V[:, None, :]
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

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.eps = cfg.ln_eps
        affine = cfg.normalization == "LN"
        self.w = nn.Parameter(torch.ones(cfg.d_model)) if affine else None
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if affine else None

    def scale(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... 1"]:
        centred = x - x.mean(-1, keepdim=True)
        return (centred.square().mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]) -> Tensor:
        """The linear part with the scale given (frozen): ``(x - mean(x)) / scale * w``, no ``b``."""
        out = (x - x.mean(-1, keepdim=True)) / scale
        return out if self.w is None else out * self.w

    def forward(
        self, x: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"] | None = None
    ) -> Float[Tensor, "... d_model"]:
        """``LN(x)``; with ``scale`` given (frozen), affine in ``x``."""
        out = self.linear(x, self.scale(x) if scale is None else scale)
        return out if self.b is None else out + self.b


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "gelu": F.gelu,
    "relu": F.relu,
}


class MLP(nn.Module):
    """A position-wise MLP: ``act(x W_in + b_in) W_out + b_out`` (the paper, column vectors:
    ``W_out act(W_in x)``), ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``."""

    def __init__(self, cfg: Config, biases: bool = False) -> None:
        super().__init__()
        self.act = ACTIVATIONS[cfg.act_fn]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if biases else None
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if biases else None

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = x @ self.W_in
        post = self.act(pre if self.b_in is None else pre + self.b_in)
        out = post @ self.W_out
        return out if self.b_out is None else out + self.b_out


def normalized(ln: LayerNorm | None, x: Tensor) -> Tensor:
    """``ln(x)``, or ``x`` itself in a model without LayerNorm."""
    return x if ln is None else ln(x)


class Block(nn.Module):
    """A residual block: an attention layer (reading ``ln1(x)`` when the model has LayerNorm) and,
    when ``d_mlp > 0``, an MLP (reading ``ln2(x)``). The paper's models have neither norm nor MLP."""

    def __init__(self, cfg: Config, biases: bool = False) -> None:
        super().__init__()
        self.ln1 = LayerNorm(cfg) if cfg.has_layer_norm else None
        self.attn = Attention(cfg, biases)
        self.ln2 = LayerNorm(cfg) if cfg.has_layer_norm and cfg.has_mlp else None
        self.mlp = MLP(cfg, biases) if cfg.has_mlp else None


ActivationCache = dict[str, Tensor]


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
        self.blocks = nn.ModuleList(Block(cfg, biases) for _ in range(cfg.n_layers))
        self.ln_final = LayerNorm(cfg) if cfg.has_layer_norm else None
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_out))  # d_vocab unless d_vocab_out says
        self.b_U = nn.Parameter(torch.zeros(cfg.d_out)) if biases else None
        self.tokenizer = None  # a tokenizers.Tokenizer, set by qkov.load when the checkpoint has one
        if init:  # skipped by whoever fills every weight next (loading a checkpoint: seconds at GPT-2 size)
            init_weights(self, torch.Generator().manual_seed(0))

    @property
    def device(self) -> torch.device:
        """Where the weights are (every analysis computes there)."""
        return self.W_E.device

    @property
    def has_biases(self) -> bool:
        return self.b_U is not None

    def check_tokens(self, tokens: Tensor, max_pos: int | None = None) -> Int[Tensor, "batch pos"]:
        """Validate a batch of token ids (at most ``max_pos``, default ``n_ctx``, per sequence),
        with a clear error for what does not fit the model, and move it to the model's device."""
        max_pos = max_pos or self.cfg.n_ctx
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
        """Logits of a final residual stream: ``ln_final(resid) @ W_U + b_U``."""
        logits = normalized(self.ln_final, resid) @ self.W_U
        return logits if self.b_U is None else logits + self.b_U

    def residual(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The final residual stream, before ``ln_final`` (the fast path: no per-head writes are kept)."""
        resid, qk_positions = self.embed(tokens)
        for block in self.blocks:
            resid = resid + block.attn(normalized(block.ln1, resid), qk_positions)
            if block.mlp is not None:
                resid = resid + block.mlp(normalized(block.ln2, resid))
        return resid

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.unembed(self.residual(self.check_tokens(tokens)))

    def loss(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]``
        (so up to ``n_ctx + 1`` tokens per sequence), with the unembedding fused into the loss
        (no full logits tensor; see :mod:`qkov.loss`)."""
        tokens = self.check_tokens(tokens, max_pos=self.cfg.n_ctx + 1)
        resid = normalized(self.ln_final, self.residual(tokens[:, :-1]))
        return unembed_cross_entropy(resid.flatten(0, 1), self.W_U, self.b_U, tokens[:, 1:].flatten())

    def run_with_cache(
        self,
        tokens: Int[Tensor, "batch pos"],
        patterns: Sequence[Float[Tensor, "batch n_heads dest src"]] | None = None,
        edit_writes: Callable[[int, Tensor], Tensor] | None = None,
        start: tuple[int, Float[Tensor, "runs pos d_model"]] | None = None,
    ) -> tuple[Float[Tensor, "batch pos d_vocab"], ActivationCache]:
        """Logits and every activation, under TransformerLens' hook names.

        The cache holds ``hook_embed`` (``W_E[tokens]``), ``hook_pos_embed`` (``W_pos[:pos]``, when
        the model has positions), and per layer ``l``: ``blocks.{l}.hook_resid_pre``,
        ``blocks.{l}.attn.hook_pattern`` ``[batch, n_heads, dest, src]``,
        ``blocks.{l}.attn.hook_result`` (every head's write, ``[batch, pos, n_heads, d_model]``) and
        ``blocks.{l}.hook_resid_post``. The final residual stream is the start of the stream
        plus the sum of all head writes (plus every ``b_O`` when the model has biases). With MLPs,
        also ``blocks.{l}.hook_resid_mid`` (after attention) and ``blocks.{l}.hook_mlp_out`` (the
        MLP's write, ``b_out`` included); with LayerNorm, each norm's scale ``[batch, pos, 1]``:
        ``blocks.{l}.ln1.hook_scale``, ``blocks.{l}.ln2.hook_scale`` and ``ln_final.hook_scale``.

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
        """
        tokens = self.check_tokens(tokens)
        if patterns is not None and len(patterns) != self.cfg.n_layers:
            raise QkovError(f"expected {self.cfg.n_layers} frozen patterns, got {len(patterns)}")
        resid, qk_positions = self.embed(tokens)
        first, cache = 0, {}
        if start is not None:
            first, resid = start
        else:
            cache["hook_embed"] = self.W_E[tokens]
        if self.W_pos is not None:
            cache["hook_pos_embed"] = self.W_pos[: tokens.shape[1]]
        for layer in range(first, self.cfg.n_layers):
            frozen = None if patterns is None else patterns[layer]
            resid = self._block_with_cache(layer, resid, qk_positions, frozen, edit_writes, cache)
        if self.ln_final is not None:
            cache[scale_hook(norm_name(None, "ln_final"))] = self.ln_final.scale(resid)
        return self.unembed(resid), cache

    def _block_with_cache(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        qk_positions: Tensor | None,
        frozen: Tensor | None,
        edit_writes: Callable[[int, Tensor], Tensor] | None,
        cache: ActivationCache,
    ) -> Float[Tensor, "batch pos d_model"]:
        """One block of :meth:`run_with_cache`: its activations into ``cache``, the stream after it out."""
        block = self.blocks[layer]
        cache[hook_name(layer, "resid_pre")] = resid
        attn_in = self._norm(block.ln1, resid, cache, norm_name(layer, "ln1"))
        writes, pattern = block.attn.head_writes(attn_in, qk_positions, frozen)
        if edit_writes is not None:
            writes = edit_writes(layer, writes)
        cache[hook_name(layer, "pattern")] = pattern
        cache[hook_name(layer, "result")] = writes
        resid = resid + writes.sum(dim=2)
        if block.attn.b_O is not None:
            resid = resid + block.attn.b_O
        if block.mlp is not None:
            cache[hook_name(layer, "resid_mid")] = resid
            mlp_out = block.mlp(self._norm(block.ln2, resid, cache, norm_name(layer, "ln2")))
            cache[hook_name(layer, "mlp_out")] = mlp_out
            resid = resid + mlp_out
        cache[hook_name(layer, "resid_post")] = resid
        return resid

    @staticmethod
    def _norm(ln: LayerNorm | None, x: Tensor, cache: ActivationCache, name: str) -> Tensor:
        """``ln(x)``, with its scale recorded in ``cache`` as ``{name}.hook_scale``."""
        if ln is None:
            return x
        scale = cache[scale_hook(name)] = ln.scale(x)
        return ln(x, scale)


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
        for W in (block.attn.W_Q, block.attn.W_K, block.attn.W_V):
            normal_(W, cfg.d_model**-0.5)
        normal_(block.attn.W_O, (cfg.n_heads * cfg.d_head * cfg.n_layers) ** -0.5)
        if block.mlp is not None:
            normal_(block.mlp.W_in, cfg.d_model**-0.5)
            normal_(block.mlp.W_out, (cfg.d_mlp * cfg.n_layers) ** -0.5)
    normal_(model.W_U, 1.0 / cfg.d_model)
    for name, param in model.named_parameters():
        short = name.rsplit(".", 1)[-1]
        if short.startswith("b_") or short == "b":
            param.zero_()
        elif short == "w":
            param.fill_(1.0)
