"""Text in and out of a model, as TransformerLens' ``to_tokens``, ``to_str_tokens`` and ``to_string``
do, through the checkpoint's own tokenizer (a Hugging Face ``tokenizers.Tokenizer``).

The start token (``prepend_bos``) is the config's ``bos_token_id``, else the tokenizer's
``<|endoftext|>`` (GPT-2's and qkov's document separator, which TransformerLens prepends for GPT-2).
By default it is prepended exactly when the model was trained with one (``bos_token_id`` set):
qkov's own models read windows of the corpus, with no start token. Tokens are shown one by one as
:func:`qkov.data.tokenizer.token_string` shows them: a byte-level piece that is not whole characters
reads as its bytes (``<E2 80>``) where TransformerLens shows ``"\\ufffd"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Int
from tokenizers import Tokenizer
from torch import Tensor

from qkov.config import Config
from qkov.data.tokenizer import END_OF_TEXT, token_string
from qkov.errors import QkovError


def is_text(value: object) -> bool:
    """Whether ``value`` is a string or a non-empty list of strings (text where tokens may be)."""
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) for v in value)


def start_token(tokenizer: Tokenizer, cfg: Config) -> int:
    """The id prepended for ``prepend_bos``: ``cfg.bos_token_id``, else ``<|endoftext|>``."""
    if cfg.bos_token_id is not None:
        return cfg.bos_token_id
    token = tokenizer.token_to_id(END_OF_TEXT)
    if token is None:
        raise QkovError(f"prepend_bos: the model has no bos_token_id and its tokenizer no {END_OF_TEXT}")
    return token


def to_tokens(
    tokenizer: Tokenizer, cfg: Config, text: str | Sequence[str], prepend_bos: bool | None = None
) -> Int[Tensor, "batch pos"]:
    """``text`` (a string, or a list of strings: one sequence each, padded on the right with the start
    token) as token ids ``[batch, pos]``; ``prepend_bos`` None: as the model was trained."""
    if not is_text(text):
        raise QkovError(f"to_tokens reads a string or a list of strings, got {type(text).__name__}")
    texts = [text] if isinstance(text, str) else list(text)
    bos = cfg.bos_token_id is not None if prepend_bos is None else prepend_bos
    start = [start_token(tokenizer, cfg)] if bos else []
    rows = [start + tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    width = max(len(row) for row in rows)
    if width == 0:
        raise QkovError("to_tokens: the text is empty (prepend_bos=True gives a one-token sequence)")
    if any(len(row) < width for row in rows):
        pad = start_token(tokenizer, cfg)
        rows = [row + [pad] * (width - len(row)) for row in rows]
    return torch.tensor(rows, dtype=torch.long)


def _id_rows(tokens: Tensor | Sequence[int] | Sequence[Sequence[int]]) -> tuple[list[list[int]], bool]:
    """Token ids as rows of ints, and whether a single sequence was given (1-D, or a batch of one)."""
    ids = torch.as_tensor(tokens) if not isinstance(tokens, Tensor) else tokens
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.ndim > 2:
        raise QkovError(f"expected token ids [pos] or [batch, pos], got {ids.dtype} {tuple(ids.shape)}")
    if ids.ndim == 0:
        ids = ids[None]
    single = ids.ndim == 1 or ids.shape[0] == 1
    return ids.reshape(-1, ids.shape[-1]).tolist(), single


def _piece(tokenizer: Tokenizer, token: int) -> str:
    """One token as it reads, a special token as its text (``<|endoftext|>``)."""
    text = tokenizer.decode([token], skip_special_tokens=False)
    return text if "\ufffd" not in text else token_string(tokenizer, token)


def to_str_tokens(
    tokenizer: Tokenizer, cfg: Config, tokens: str | Sequence | Tensor, prepend_bos: bool | None = None
) -> list[str] | list[list[str]]:
    """Each token as it reads: of a string (through :func:`to_tokens`), a 1-D sequence of ids or a
    batch of one (``list[str]``), or of a list of strings or a batch (``list[list[str]]``)."""
    if is_text(tokens):
        ids = to_tokens(tokenizer, cfg, tokens, prepend_bos)
        rows, single = ids.tolist(), isinstance(tokens, str)
    else:
        rows, single = _id_rows(tokens)
    strings = [[_piece(tokenizer, t) for t in row] for row in rows]
    return strings[0] if single else strings


def to_string(tokenizer: Tokenizer, tokens: Tensor | Sequence) -> str | list[str]:
    """Token ids back to text, special tokens included: one string for a 1-D sequence, a list for a
    batch ``[batch, pos]``."""
    ids = torch.as_tensor(tokens) if not isinstance(tokens, Tensor) else tokens
    rows, _ = _id_rows(ids)
    texts = [tokenizer.decode(row, skip_special_tokens=False) for row in rows]
    return texts[0] if ids.ndim <= 1 else texts
