"""A byte-level BPE tokenizer trained locally with HF ``tokenizers`` (no download).

Byte-level means every string, binary junk included, has an encoding. Documents are separated by
the special token ``<|endoftext|>`` (id 0), as in GPT-2.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from qkov.errors import QkovError

END_OF_TEXT = "<|endoftext|>"
MIN_VOCAB = 257  # the 256 bytes and the end-of-text token


def train_tokenizer(texts: Iterable[str], vocab_size: int, length: int | None = None) -> Tokenizer:
    """Byte-level BPE with ``vocab_size`` tokens trained on ``texts`` (``length`` of them, if known)."""
    if vocab_size < MIN_VOCAB:
        raise QkovError(
            f"vocabulary size must be at least {MIN_VOCAB} (256 bytes + end of text), got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=length)
    return tokenizer


def end_of_text_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(END_OF_TEXT)
    if token_id is None:
        raise QkovError(f"tokenizer has no {END_OF_TEXT} token")
    return token_id


def token_strings(tokenizer: Tokenizer | None, d_vocab: int) -> list[str]:
    """How each token reads: its decoded text, or ``#id`` without a tokenizer."""
    if tokenizer is None:
        return [f"#{i}" for i in range(d_vocab)]
    return [tokenizer.decode([i]) for i in range(d_vocab)]
