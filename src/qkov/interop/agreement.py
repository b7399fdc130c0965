"""Does an imported model compute what its source computes? The largest difference between its
log-probabilities and those of a reference (the source's own forward, or logits saved from it), in
float64: a mapping that reads a tensor in the wrong orientation or splits heads in the wrong order
shows up here as a difference of order one, an exact import as float rounding."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.checkpoint import read_tensors
from qkov.errors import QkovError
from qkov.model import Transformer

TOLERANCE = 1e-4  # log-probabilities; float32 sources agree to about 1e-6, a wrong layout to about 1


def log_prob_difference(
    model: Transformer, tokens: Int[Tensor, "batch pos"], reference: Float[Tensor, "batch pos d_vocab"]
) -> float:
    """``max |log_softmax(model(tokens)) - log_softmax(reference)|``, both in float64 (``reference``
    holds logits or log-probabilities: ``log_softmax`` of log-probabilities is themselves)."""
    tokens = model.check_tokens(tokens)
    if tuple(reference.shape) != (*tokens.shape, model.cfg.d_out):
        raise QkovError(
            f"reference logits have shape {tuple(reference.shape)}, expected "
            f"{(*tokens.shape, model.cfg.d_out)} (the tokens' shape and the output width)"
        )
    with torch.no_grad():
        ours = copy.deepcopy(model).double()(tokens).log_softmax(-1)
        theirs = reference.detach().to(ours.device, torch.float64).log_softmax(-1)
    return float((ours - theirs).abs().max())


def reference_tolerance(reference: Tensor) -> float:
    """The largest log-probability difference a correct import may show against ``reference``:
    :data:`TOLERANCE`, or, for logits saved in float32 or half precision, 1024 units in the last
    place of the reference's largest log-probability when that is more (a float32 forward's own
    rounding grows with the logits: a trained classifier's TransformerLens float32 log-probabilities
    differ from float64 by 2.6e-4). A wrong layout differs by order one, far above either."""
    if reference.dtype == torch.float64 or not reference.dtype.is_floating_point:
        return TOLERANCE
    largest = float(reference.detach().double().log_softmax(-1).abs().nan_to_num(0).max())
    return max(TOLERANCE, 1024 * torch.finfo(reference.dtype).eps * max(1.0, largest))


def checked_agreement(
    model: Transformer, tokens: Tensor, reference: Tensor, what: str, tolerance: float | None = None
) -> str:
    """The line that reports the agreement with ``what``; raises :class:`QkovError` (one line)
    when the largest log-probability difference exceeds ``tolerance`` (default: what the
    reference's precision allows, :func:`reference_tolerance`)."""
    tolerance = reference_tolerance(reference) if tolerance is None else tolerance
    difference = log_prob_difference(model, tokens, reference)
    batch, pos = model.check_tokens(tokens).shape
    line = f"largest log-probability difference against {what}: {difference:.1e} ({batch} x {pos} tokens)"
    if not difference <= tolerance:
        raise QkovError(f"the imported model disagrees: {line}, above the tolerance {tolerance:.2g}")
    return line


def forward_reference(
    model: Transformer, forward: Callable[[Tensor], Tensor], tokens: Tensor | None = None
) -> tuple[Int[Tensor, "batch pos"], Tensor]:
    """Tokens (given, else 4 random sequences of ``n_ctx`` tokens, seed 0) and ``forward``'s
    logits on them."""
    if tokens is None:
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, model.cfg.d_vocab, (4, model.cfg.n_ctx), generator=generator)
    with torch.no_grad():
        return tokens, forward(tokens)


def reference_file(path: str | os.PathLike) -> tuple[Int[Tensor, "batch pos"], Tensor]:
    """``tokens`` (integer, ``[batch, pos]``) and ``logits`` (or log-probabilities,
    ``[batch, pos, d_vocab]``) from a safetensors file saved from the source's own forward."""
    tensors, _ = read_tensors(Path(path))
    missing = [name for name in ("tokens", "logits") if name not in tensors]
    if missing:
        raise QkovError(f"{path}: missing tensor {missing[0]} (a reference holds tokens and logits)")
    return tensors["tokens"], tensors["logits"]
