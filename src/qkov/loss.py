"""Next-token cross-entropy fused with the unembedding, computed a chunk of positions at a time.

The unembedding dominates a small model's cost, and its ``[tokens, d_vocab]`` logits are the
largest tensor of a training step. Computing the loss and its gradients chunk by chunk, with the
logits of one chunk alive at a time (16 MiB, in the last-level cache), skips two full passes over a
logits tensor of hundreds of MiB. The result equals ``F.cross_entropy(resid @ W_U + b_U, targets)`` and
its gradients (tested against that to float64 precision).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

CHUNK_BYTES = 16 * 2**20  # logits of one chunk: 16 MiB, which stay in the last-level cache (measured best)
# On a GPU a chunk of 16 MiB would be ~80 tokens at a 50k vocabulary, too small a matmul to fill the
# device. With 1 GiB chunks the paper-size 2-layer model trains at 323k tokens/s on an H200
# (benchmarks/README.md, gpu_train.py); other chunk sizes were not compared.
GPU_CHUNK_BYTES = 2**30
# :func:`row_losses` forms the logits in one buffer reused from call to call, a block of at most
# BLOCK_ROWS rows by BLOCK_COLUMNS columns on a CPU, which stays in cache: against whole rows (the
# logits of 1,040 tokens at GPT-2's 50,257 outputs are 209 MB, written to memory and read back) the
# losses took 0.67-0.71x the time at GPT-2 small's shapes and 0.95x at Llama-3.2-1B's, 2 threads
# (benchmarks/README.md, "Losses a block of columns at a time"). A GPU takes whole rows, at most
# GPU_LOGIT_BYTES of them: a block this small would be too small a product to fill it.
BLOCK_ROWS, BLOCK_COLUMNS = 2048, 1024
GPU_LOGIT_BYTES = 256 * 2**20


def shifted_exp_(
    logits: Float[Tensor, "rows d_vocab"],
) -> tuple[Float[Tensor, "rows d_vocab"], Float[Tensor, "rows 1"], Float[Tensor, "rows 1"]]:
    """``logits`` overwritten by ``exp(logits - row max)`` in place (one pass, no temporaries), with
    its row sums and the row maxima: the logsumexp is ``max + log(sum)``, the softmax ``exp / sum``."""
    row_max = logits.amax(dim=-1, keepdim=True)
    exps = logits.sub_(row_max).exp_()
    return exps, exps.sum(dim=-1, keepdim=True), row_max


def logsumexp_(x: Float[Tensor, "rows cols"]) -> Float[Tensor, " rows"]:
    """Each row's ``logsumexp``, ``x`` overwritten (``torch.logsumexp`` takes a block as large)."""
    _, sums, top = shifted_exp_(x)
    return sums[:, 0].log_() + top[:, 0]


def row_blocks(count: int, most: int) -> list[slice]:
    """``range(count)`` in the fewest blocks of at most ``most`` rows, as even as can be: 1,032 rows
    in blocks of at most 1,024 are two of 516, not 1,024 and a block of 8 whose products run slowly."""
    blocks = -(-count // most)
    return [slice(count * block // blocks, count * (block + 1) // blocks) for block in range(blocks)]


def logit_buffer(rows: int, W_U: Float[Tensor, "d_model d_vocab"]) -> Float[Tensor, "block_rows block_cols"]:
    """Room for :func:`row_losses`' logits of ``rows`` rows, in ``W_U``'s dtype and on its device: a
    block of at most ``BLOCK_ROWS`` x ``BLOCK_COLUMNS`` on a CPU, whole rows on a GPU (as many as
    ``GPU_LOGIT_BYTES`` hold, at least one)."""
    d_vocab = W_U.shape[1]
    if W_U.device.type == "cpu":
        shape = (min(rows, BLOCK_ROWS), min(d_vocab, BLOCK_COLUMNS))
    else:
        shape = (min(rows, max(1, GPU_LOGIT_BYTES // (W_U.element_size() * d_vocab))), d_vocab)
    return torch.empty(max(1, shape[0]), shape[1], dtype=W_U.dtype, device=W_U.device)


def row_losses(
    normed: Float[Tensor, "rows d_model"],
    W_U: Float[Tensor, "d_model d_vocab"],
    b_U: Float[Tensor, " d_vocab"] | None,
    targets: Int[Tensor, " rows"],
    buffer: Float[Tensor, "block_rows block_columns"],
    soft_cap: float | None = None,
) -> Float[Tensor, " rows"]:
    """:func:`token_losses` of ``normed @ W_U + b_U`` (soft-capped, ``cap * tanh(logits / cap)``,
    when ``soft_cap`` is given), the logits formed a block at a time in ``buffer``
    (:func:`logit_buffer`, its shape the block's largest): no tensor as large as every row's logits,
    and none fresh per call. Each row's ``logsumexp`` is combined over the blocks of columns (the
    running maximum rescales the running sum), and its target's logit read from the block that
    holds it."""
    wide = torch.promote_types(buffer.dtype, torch.float32)
    losses = torch.empty(len(normed), dtype=wide, device=normed.device)
    for rows in row_blocks(len(normed), len(buffer)):
        losses[rows] = _block_losses(normed[rows], W_U, b_U, targets[rows].clamp_min(0), buffer, soft_cap)
    return losses.masked_fill_(targets < 0, 0)


def _block_losses(
    normed: Float[Tensor, "rows d_model"],
    W_U: Float[Tensor, "d_model d_vocab"],
    b_U: Float[Tensor, " d_vocab"] | None,
    targets: Int[Tensor, " rows"],
    buffer: Tensor,
    soft_cap: float | None,
) -> Float[Tensor, " rows"]:
    """:func:`row_losses` of at most ``len(buffer)`` rows, ``buffer.shape[1]`` columns at a time."""
    wide = torch.promote_types(buffer.dtype, torch.float32)
    top = torch.full((len(normed),), -torch.inf, dtype=wide, device=normed.device)
    total, chosen = torch.zeros_like(top), torch.zeros_like(top)
    for first in range(0, W_U.shape[1], buffer.shape[1]):
        cols = slice(first, first + buffer.shape[1])
        block = W_U[:, cols]
        width = block.shape[1]
        room = buffer.view(-1)[: len(normed) * width].view(len(normed), width)
        logits = torch.matmul(normed, block, out=room)
        if b_U is not None:
            logits += b_U[cols]
        if soft_cap is not None:
            logits.div_(soft_cap).tanh_().mul_(soft_cap)
        logits = logits.to(wide)  # bfloat16 logits upcast, as token_losses does
        here = targets - first
        inside = (here >= 0) & (here < width)
        chosen = torch.where(inside, logits.gather(1, here.clamp(0, width - 1)[:, None])[:, 0], chosen)
        higher = torch.maximum(top, logits.amax(1))
        total = total * (top - higher).exp() + logits.sub_(higher[:, None]).exp_().sum(1)
        top = higher
    return top + total.log() - chosen


class _UnembedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``resid @ W_U + b_U`` against ``targets``; the gradients are formed
    in the forward pass, chunk by chunk, and scaled in the backward."""

    @staticmethod
    def forward(ctx, resid, W_U, b_U, targets, with_grad):
        n_tokens, d_vocab = resid.shape[0], W_U.shape[1]
        chunk = max(1, (CHUNK_BYTES if resid.device.type == "cpu" else GPU_CHUNK_BYTES) // (4 * d_vocab))
        total = torch.zeros((), dtype=torch.promote_types(resid.dtype, torch.float32), device=resid.device)
        grads = None
        if with_grad:
            grads = [
                torch.empty_like(resid),
                torch.zeros_like(W_U, dtype=torch.promote_types(W_U.dtype, torch.float32)),
                None
                if b_U is None
                else torch.zeros_like(b_U, dtype=torch.promote_types(b_U.dtype, torch.float32)),
            ]
        for start in range(0, n_tokens, chunk):
            h, t = resid[start : start + chunk], targets[start : start + chunk]
            logits = (h @ W_U).to(total.dtype)
            if b_U is not None:
                logits += b_U
            target_logits = logits.gather(1, t[:, None])[:, 0]
            probs, sums, row_max = shifted_exp_(logits)
            total += (row_max[:, 0] + sums[:, 0].log() - target_logits).sum()  # logsumexp - target
            if grads is None:
                continue
            # d(mean loss)/d(logits) = (softmax - one_hot(target)) / n_tokens, in place.
            g = probs.div_(sums * n_tokens)
            g[torch.arange(len(t), device=g.device), t] -= 1.0 / n_tokens
            if torch.is_autocast_enabled(resid.device.type):  # products in bfloat16, accumulated in float32
                grads[0][start : start + chunk] = g @ W_U.mT
                grads[1] += h.mT @ g
            else:  # the accumulation fused into the matrix multiplication
                torch.matmul(g, W_U.mT, out=grads[0][start : start + chunk])
                grads[1].addmm_(h.mT, g)
            if grads[2] is not None:
                grads[2] += g.sum(0)
        if grads is not None:
            ctx.save_for_backward(*(x for x in grads if x is not None))
            ctx.has_bias = b_U is not None
            ctx.dtypes = (W_U.dtype, None if b_U is None else b_U.dtype)
        return total / n_tokens

    @staticmethod
    def backward(ctx, grad_output):
        saved = ctx.saved_tensors
        grad_resid = saved[0] * grad_output
        grad_W = (saved[1] * grad_output).to(ctx.dtypes[0])
        grad_b = (saved[2] * grad_output).to(ctx.dtypes[1]) if ctx.has_bias else None
        return grad_resid, grad_W, grad_b, None, None


def unembed_cross_entropy(
    resid: Float[Tensor, "tokens d_model"],
    W_U: Float[Tensor, "d_model d_vocab"],
    b_U: Float[Tensor, "d_vocab"] | None,
    targets: Int[Tensor, "tokens"],
) -> Float[Tensor, ""]:
    """``F.cross_entropy(resid @ W_U + b_U, targets)`` without the full logits tensor."""
    with_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (resid, W_U, b_U))
    return _UnembedCrossEntropy.apply(resid, W_U, b_U, targets, with_grad)


def token_losses(
    logits: Float[Tensor, "batch pos d_vocab"], targets: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos"]:
    """The cross-entropy at every position, in float32 or wider (bfloat16 logits are upcast, float64
    ones kept): for next-token losses pass ``logits[:, :-1]`` and ``tokens[:, 1:]``, so ``[b, i]`` is
    the loss of predicting token ``i + 1`` having seen tokens ``0 ... i``."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    # logsumexp minus the target's logit, reduced over the contiguous last axis: ``F.cross_entropy``
    # wants the classes second, and on that transposed view ran 10x slower at a 50k vocabulary. A
    # negative target (-100: none) has loss 0, as ``F.cross_entropy``'s ``ignore_index`` gives.
    chosen = wide.gather(-1, targets.clamp_min(0)[..., None])[..., 0]
    return (wide.logsumexp(-1) - chosen).masked_fill(targets < 0, 0)
