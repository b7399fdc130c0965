"""The fused unembedding + cross-entropy against F.cross_entropy on full logits, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import qkov
from qkov import loss as loss_module
from qkov.loss import BLOCK_COLUMNS, BLOCK_ROWS, logit_buffer, row_blocks, token_losses, unembed_cross_entropy

from conftest import random_model


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_bytes", [8, 1000, 2**22])  # one row per chunk, a few rows, all rows
def test_loss_and_gradients_equal_the_unfused_ones(bias, chunk_bytes, monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(0)
    resid = torch.randn(37, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    W_U = torch.randn(6, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    b_U = torch.randn(11, generator=gen, dtype=torch.float64, requires_grad=True) if bias else None
    targets = torch.randint(0, 11, (37,), generator=gen)
    fused = unembed_cross_entropy(resid, W_U, b_U, targets)
    (3.0 * fused).backward()
    grads = [x.grad.clone() for x in (resid, W_U, b_U) if x is not None]
    for x in (resid, W_U, b_U):
        if x is not None:
            x.grad = None
    logits = resid @ W_U + (b_U if b_U is not None else 0)
    reference = F.cross_entropy(logits, targets)
    (3.0 * reference).backward()
    torch.testing.assert_close(fused, reference, rtol=1e-12, atol=1e-12)
    for got, x in zip(grads, [x for x in (resid, W_U, b_U) if x is not None], strict=True):
        torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-12)


def test_model_loss_equals_cross_entropy_of_its_logits():
    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=19, n_ctx=10)
    model = random_model(cfg, biases=True).double()
    tokens = torch.randint(0, 19, (3, 10))
    logits = model(tokens[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    torch.testing.assert_close(model.loss(tokens), expected, rtol=1e-12, atol=1e-12)


def test_no_gradient_work_without_autograd():
    resid, W_U = torch.randn(5, 4), torch.randn(4, 7)
    with torch.no_grad():
        value = unembed_cross_entropy(resid, W_U, None, torch.zeros(5, dtype=torch.long))
    assert value.grad_fn is None and value > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_token_losses_are_the_cross_entropy_at_every_position(dtype):
    """``logsumexp - target logit`` over the last axis, against ``F.cross_entropy`` in float64 (a
    bfloat16 input upcast first), with logits far from zero so that the shift matters, and 0 where
    the target is -100."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=generator, dtype=torch.float64) * 4 + 50).to(dtype)
    targets = torch.randint(0, 11, (3, 5), generator=generator)
    targets[1, 2] = -100  # no target there: loss 0, as F.cross_entropy's ignore_index
    got = token_losses(logits, targets)
    want = F.cross_entropy(logits.double().transpose(1, 2), targets, reduction="none")
    assert got.dtype == torch.promote_types(dtype, torch.float32)
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-12 if dtype == torch.float64 else 2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cap", [None, 7.5])
# (rows, columns) of a block: a row or a column at a time, blocks with a shorter last one (18 rows in
# blocks of at most 4 are 3, 3, 4, ...; 19 columns in blocks of 5 end with 4), whole rows, all at once
@pytest.mark.parametrize("block", [(1, 19), (4, 1), (4, 5), (1000, 19), (1000, 7)])
def test_stream_losses_in_a_buffer_equal_the_losses_of_the_logits(dtype, cap, block):
    """:meth:`Transformer.stream_losses`, the logits formed a block of positions and outputs at a
    time in one buffer reused from block to block (each row's logsumexp combined over the blocks of
    columns), equals ``token_losses`` of the model's own logits (``unembed``: the final norm, ``b_U``
    and the soft-cap when there is one), with a position without a target (-100: loss 0) and
    targets in the first and the last column; no gradient, though the weights take one."""
    cfg = qkov.Config(
        n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=19, n_ctx=10, normalization="LN",
        output_logits_soft_cap=cap,
    )  # fmt: skip
    model = random_model(cfg, biases=True).to(dtype)
    generator = torch.Generator().manual_seed(0)
    resid = (torch.randn(3, 6, 8, generator=generator, dtype=torch.float64) * 3).to(dtype)
    targets = torch.randint(0, 19, (3, 6), generator=generator)
    targets[2, 1] = -100
    targets[0, :2] = torch.tensor([0, 18])
    buffer = torch.empty(block, dtype=dtype)
    got = model.stream_losses(resid, targets, buffer)
    want = token_losses(model.unembed(resid), targets)
    assert got.dtype == want.dtype and got.shape == targets.shape and got[2, 1] == 0
    assert not got.requires_grad and want.requires_grad
    torch.testing.assert_close(got, want.detach(), rtol=1e-12 if dtype == torch.float64 else 1e-2, atol=1e-12)


def test_the_logit_buffer_is_a_block_that_the_losses_fill_whole_rows_of_on_a_gpu_only():
    """On a CPU the buffer is at most ``BLOCK_ROWS x BLOCK_COLUMNS`` (fewer where the call has fewer
    rows or outputs); it is reused, so the losses of more rows than it holds still come out right."""
    W_U = torch.zeros(4, 3 * BLOCK_COLUMNS + 5)
    assert logit_buffer(10, W_U).shape == (10, BLOCK_COLUMNS)
    assert logit_buffer(10 * BLOCK_ROWS, W_U).shape == (BLOCK_ROWS, BLOCK_COLUMNS)
    assert logit_buffer(3, torch.zeros(4, 7)).shape == (3, 7)


@given(count=st.integers(0, 10_000), most=st.integers(1, 3000))
def test_rows_split_into_the_fewest_even_blocks(count, most):
    """The row blocks (of the losses, and of term importance's first-order terms) cover every row
    once, in order, each at most ``most`` rows, as few as can be and within one row of each other in
    size."""
    blocks = row_blocks(count, most)
    assert [i for b in blocks for i in range(b.start, b.stop)] == list(range(count))
    assert len(blocks) == -(-count // most)
    sizes = [b.stop - b.start for b in blocks]
    assert all(size <= most for size in sizes) and max(sizes, default=0) - min(sizes, default=0) <= 1
