"""Repeated random tokens, the paper's induction test (``qkov.data.random_tokens``): the repeats, the
start token, and the loss per repeat that leaves out each copy's unpredictable first token."""

from __future__ import annotations

import pytest
import torch

import qkov
from qkov.data.random_tokens import loss_per_repeat, repeated_random_tokens


def test_repeated_random_tokens_repeat():
    tokens = repeated_random_tokens(3, 10, 3, 50, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 30)
    assert torch.equal(tokens[:, :10], tokens[:, 10:20]) and torch.equal(tokens[:, :10], tokens[:, 20:])
    assert tokens.min() >= 1 and tokens.max() < 50


def test_the_block_is_torchs_draw_from_one():
    tokens = repeated_random_tokens(2, 4, 2, 9, torch.Generator().manual_seed(7))
    block = torch.randint(1, 9, (2, 4), generator=torch.Generator().manual_seed(7))
    assert torch.equal(tokens, torch.cat([block, block], dim=1))


def test_a_start_token_comes_first_and_never_again():
    tokens = repeated_random_tokens(200, 4, 3, 6, torch.Generator().manual_seed(0), bos_token_id=2)
    assert tokens.shape == (200, 13) and torch.all(tokens[:, 0] == 2)
    assert set(tokens[:, 1:].unique().tolist()) == {1, 3, 4, 5}  # neither end-of-text nor the start token
    again = repeated_random_tokens(200, 4, 3, 6, torch.Generator().manual_seed(0), bos_token_id=2)
    assert torch.equal(tokens, again)  # the same seed, the same tokens
    at_zero = repeated_random_tokens(2, 4, 3, 6, torch.Generator().manual_seed(0), bos_token_id=0)
    assert torch.equal(at_zero[:, 1:], repeated_random_tokens(2, 4, 3, 6, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, 3, 2), "length >= 2 and repeats >= 2, got 1, 3"),
        ((3, 1, 2), "length >= 2 and repeats >= 2, got 3, 1"),
        ((3, 3, 1), "a vocabulary of at least 2 tokens"),
    ],
)
def test_too_small_shapes_are_one_line(args, message):
    length, repeats, d_vocab = args
    with pytest.raises(qkov.QkovError, match=message):
        repeated_random_tokens(1, length, repeats, d_vocab, torch.Generator())
    with pytest.raises(qkov.QkovError, match="a vocabulary of at least 3 tokens"):
        repeated_random_tokens(1, 3, 2, 2, torch.Generator(), bos_token_id=1)


def test_loss_per_repeat_leaves_out_each_copys_unpredictable_first_token():
    # period 4, 3 copies: 11 next-token losses; the losses at positions 3 and 7 predict the first
    # token of copies 2 and 3, which follow a pair never seen before
    losses = torch.tensor([[1.0, 1.0, 1.0, 99.0, 2.0, 2.0, 2.0, 99.0, 3.0, 3.0, 3.0]])
    assert loss_per_repeat(losses, 4) == [1.0, 2.0, 3.0]
    assert loss_per_repeat(torch.stack([losses[0], losses[0] + 1]), 4) == [1.5, 2.5, 3.5]  # batch averaged
    with pytest.raises(qkov.QkovError, match="period of at least 2"):
        loss_per_repeat(losses, 1)


def test_positions_past_the_last_whole_repeat_are_ignored():
    losses = torch.tensor([1.0, 3.0, 99.0, 5.0, 7.0, 99.0, 11.0])  # period 3: two repeats, then one stray
    assert loss_per_repeat(losses, 3) == [2.0, 6.0]
