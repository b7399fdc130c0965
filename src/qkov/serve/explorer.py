"""The one loaded checkpoint and what every view needs from it: token strings (and output
names: a classifier's outputs are classes, not tokens), the checked inputs (text, tokens, heads,
positions, top-k, rows of the user's data), the model the circuits read (LayerNorm folded in
once, at load), and the full circuits, built once on first use.

Every input a request carries is checked here against the model and refused with a
:class:`QkovError` naming the allowed range (the app answers 400): never clamped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from qkov.analyze import STEPS
from qkov.circuits.qk_ov import shared_full_ov_circuit, shared_full_qk_circuit
from qkov.data.tokenizer import token_strings
from qkov.data.user_tokens import UserTokens
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.linalg import FactoredMatrix, SharedFactoredMatrix
from qkov.model import AttnOnlyTransformer
from qkov.names import head_name, parse_head

T = TypeVar("T")
MAX_K = 200  # the longest top-k table a view returns: more is not readable in a page
MAX_TEXT_CHARS = 4000  # typed text; the URL holds it (browsers and servers cut URLs near 8-16 KB)


class Explorer:
    """A model, loaded once, with its token strings; views read it and never change it.

    ``model`` is the model as loaded: the text views run it. ``circuit`` is the model every
    weight-based view reads (:func:`qkov.interop.fold.circuit_model`: with ``normalization="LN"``
    the folded form, so that LayerNorm's weight is in every circuit; else ``model`` itself),
    folded here once rather than by every circuit function on every call. ``data``: the user's
    own tokens and targets (``qkov serve --tokens``), read and checked once at start."""

    def __init__(self, model: AttnOnlyTransformer, name: str, data: UserTokens | None = None) -> None:
        self.model = model.eval().requires_grad_(False)
        self.circuit = circuit_model(self.model).eval().requires_grad_(False)
        self.name = name
        self.cfg = model.cfg
        self.data = data
        self.strings = token_strings(model.tokenizer, model.cfg.d_vocab)
        self._built: dict[str, object] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def once(self, name: str, build: Callable[[], T]) -> T:
        """``build()``'s value, computed on first use and kept (circuits and tables that many
        views read: a fixed, small set, unlike the bounded cache of answers). One build per name
        at a time; builds of different names do not wait for each other."""
        with self._locks_lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._built:
                with torch.no_grad():
                    self._built[name] = build()
            return self._built[name]

    @property
    def full_ov(self) -> SharedFactoredMatrix:
        """Every head's full OV circuit ``W_E (W_V W_O) W_U``, with ``W_E`` and ``W_U`` kept shared."""
        return self.once("full_ov", lambda: shared_full_ov_circuit(self.circuit))

    @property
    def full_qk(self) -> SharedFactoredMatrix:
        """Every head's full QK circuit ``W_E (W_Q W_K^T / sqrt(d_head)) W_E^T``, ``W_E`` shared."""
        return self.once("full_qk", lambda: shared_full_qk_circuit(self.circuit))

    def circuit_row(self, circuit: str, layer: int, head: int, token: int) -> FactoredMatrix:
        """Row ``token`` of one head's full OV or QK circuit, ``[1, d_vocab]``, factored: built for
        this row alone from the shared factors, so nothing vocabulary-long is kept per head (a
        model with a 50k vocabulary would need gigabytes for every head's factors)."""
        full = self.full_ov if circuit == "OV" else self.full_qk
        return FactoredMatrix(
            full.left[token : token + 1] @ full.inner.A[layer, head], full.inner.B[layer, head] @ full.right
        )

    def output(self, index: int) -> dict:
        """How the model's output ``index`` reads: its token, or on a classifier (``d_vocab_out``)
        the class index, which names no token of the vocabulary."""
        return {"id": index, "str": self.strings[index] if self.cfg.outputs_tokens else f"class {index}"}

    def outputs_listed(self, ids: list[int], values: list[float]) -> list[dict]:
        """Output ids and values as table rows ``{"id", "str", "value"}`` (see :meth:`output`)."""
        return [self.output(i) | {"value": v} for i, v in zip(ids, values, strict=True)]

    @property
    def square_reason(self) -> str | None:
        """Why the views that need a square token-to-token circuit (copying, skip-trigrams, the
        head scores on repeated tokens) do not apply, as analyze says it; None when they do."""
        copying = next(step for step in STEPS if step.name == "copying")
        return copying.skip_reason(self.cfg, has_corpus=False)

    def require_square(self) -> None:
        if (reason := self.square_reason) is not None:
            raise QkovError(reason)

    # -- checked inputs ---------------------------------------------------------------------------
    def describe(self) -> dict:
        data = self.data
        return {
            "name": self.name,
            "config": self.cfg.to_dict(),
            "heads": [
                head_name(layer, head)
                for layer in range(self.cfg.n_layers)
                for head in range(self.cfg.n_heads)
            ],
            "has_tokenizer": self.model.tokenizer is not None,
            "max_k": self.max_k,
            "max_text_chars": MAX_TEXT_CHARS,
            "d_out": self.cfg.d_out,
            "square_reason": self.square_reason,
            "data": None if data is None else {"description": data.description, "rows": len(data.tokens)},
        }

    @property
    def max_k(self) -> int:
        return min(MAX_K, self.cfg.d_vocab)

    def tokens(self, text: str) -> list[int]:
        """The token ids of ``text``: the checkpoint's tokenizer, or, without one, ids written
        as numbers (``"3 14 15"`` or ``"#3 #14 #15"``)."""
        if len(text) > MAX_TEXT_CHARS:
            raise QkovError(f"text of {len(text)} characters is longer than the limit of {MAX_TEXT_CHARS}")
        if self.model.tokenizer is not None:
            ids = self.model.tokenizer.encode(text).ids
            if self.cfg.bos_token_id is not None:  # as the model read text in training
                ids = [self.cfg.bos_token_id, *ids]
        else:
            try:
                ids = [int(part.removeprefix("#")) for part in text.split()]
            except ValueError:
                raise QkovError("this checkpoint has no tokenizer: give token ids, e.g. '3 14 15'") from None
            for i in ids:
                self.token(i)
        if not ids:
            raise QkovError("the text has no tokens")
        if len(ids) > self.cfg.n_ctx:
            raise QkovError(f"text of {len(ids)} tokens is longer than the context (n_ctx={self.cfg.n_ctx})")
        return ids

    def token(self, token: int) -> int:
        if not 0 <= token < self.cfg.d_vocab:
            raise QkovError(
                f"token id {token} out of range: the vocabulary has ids 0 to {self.cfg.d_vocab - 1}"
            )
        return token

    def head(self, name: str) -> tuple[int, int]:
        if self.cfg.n_layers == 0:
            raise QkovError("a model with no layers has no attention heads")
        return parse_head(name, self.cfg)

    def pair(self, writer: str, reader: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """Two heads, the writer in an earlier layer than the reader."""
        (l1, h1), (l2, h2) = self.head(writer), self.head(reader)
        if l1 >= l2:
            raise QkovError(f"{writer} must be in an earlier layer than {reader} to compose with it")
        return (l1, h1), (l2, h2)

    def k(self, k: int, of: int | None = None) -> int:
        """A top-k table's length: at most :attr:`max_k`, and at most ``of`` entries to choose from."""
        most = self.max_k if of is None else min(self.max_k, of)
        if not 1 <= k <= most:
            raise QkovError(f"k={k} out of range: top-k tables hold 1 to {most} entries")
        return k

    def row(self, row: int) -> tuple[list[int], list[int]]:
        """Row ``row`` of the user's data: its token ids and targets (``-100``: no target)."""
        if self.data is None:
            raise QkovError("no data was given: start the explorer with --tokens FILE [--targets FILE]")
        rows = self.data.tokens.shape[0]
        if not 0 <= row < rows:
            raise QkovError(f"row {row} out of range: the data has rows 0 to {rows - 1}")
        return self.data.tokens[row].tolist(), self.data.targets[row].tolist()

    def listed(self, ids: list[int], values: list[float]) -> list[dict]:
        """Token ids and values as table rows ``{"id", "str", "value"}``."""
        return [{"id": i, "str": self.strings[i], "value": v} for i, v in zip(ids, values, strict=True)]

    def search(self, prefix: str, k: int) -> dict:
        """Tokens whose string starts with ``prefix`` (case-sensitive matches first, then
        case-insensitive), at most ``k``; ``#123`` finds token 123."""
        self.k(k)
        if len(prefix) > MAX_TEXT_CHARS:
            raise QkovError(f"prefix longer than {MAX_TEXT_CHARS} characters")
        number = prefix[1:]  # ASCII digits only: "²" and "١" are digits to str.isdigit, not to int
        if prefix.startswith("#") and number.isascii() and number.isdecimal():
            token = self.token(int(prefix[1:]))
            return {"prefix": prefix, "matches": [{"id": token, "str": self.strings[token]}], "more": False}
        exact = [i for i, s in enumerate(self.strings) if s.startswith(prefix)]
        folded = prefix.casefold()
        seen = set(exact)
        loose = [i for i, s in enumerate(self.strings) if i not in seen and s.casefold().startswith(folded)]
        found = exact + loose
        return {
            "prefix": prefix,
            "matches": [{"id": i, "str": self.strings[i]} for i in found[:k]],
            "more": len(found) > k,
        }
