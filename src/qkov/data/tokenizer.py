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


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (the alphabet of a byte-level BPE's pieces) -> the
    byte: printable Latin-1 bytes stand for themselves, the others for ``chr(256 + n)`` in order."""
    spans = (("!", "~"), ("¡", "¬"), ("®", "ÿ"))
    printable = [b for first, last in spans for b in range(ord(first), ord(last) + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTE_LEVEL = _byte_level_alphabet()


def readable_bytes(data: bytes) -> str:
    """``data`` decoded as UTF-8, each run of bytes that are not whole characters written as their
    hexadecimal values in angle brackets: ``b" \\xe2\\x80"`` reads ``" <E2 80>"``."""
    out: list[str] = []
    bad = bytearray()
    while data:
        try:
            good, start, end = data.decode("utf-8"), len(data), len(data)
        except UnicodeDecodeError as error:
            good, start, end = data[: error.start].decode("utf-8"), error.start, error.end
        if good and bad:
            out.append("<" + " ".join(f"{b:02X}" for b in bad) + ">")
            bad.clear()
        out.append(good)
        bad += data[start:end]
        data = data[end:]
    if bad:
        out.append("<" + " ".join(f"{b:02X}" for b in bad) + ">")
    return "".join(out)


def token_string(tokenizer: Tokenizer, token_id: int) -> str:
    """How one token reads: its decoded text; a byte-level piece that is not whole UTF-8 characters
    as its bytes (:func:`readable_bytes`), so that no two such pieces read alike."""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.id_to_token(token_id)
    if piece is None or not piece or any(c not in BYTE_LEVEL for c in piece):
        return text  # not a byte-level piece: a genuine replacement character, or unknown bytes
    return readable_bytes(bytes(BYTE_LEVEL[c] for c in piece))


def token_strings(tokenizer: Tokenizer | None, d_vocab: int) -> list[str]:
    """How each token reads (:func:`token_string`), or ``#id`` without a tokenizer: the one
    rendering of tokens the report, the explorer and the notebook views share."""
    if tokenizer is None:
        return [f"#{i}" for i in range(d_vocab)]
    return [token_string(tokenizer, i) for i in range(d_vocab)]
