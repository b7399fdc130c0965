"""The report's attention viewer and head tables, inline: :func:`attention` for any patterns (or a
model's on some tokens), :func:`heads` for every head's scores.

Patterns are ``pattern[dest][src]``, the softmax over sources of the scores (row vectors, as in
TransformerLens: row ``dest`` of ``softmax(x W_Q (x W_K)^T / sqrt(d_head))``; the paper's ``A^h``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from tokenizers import Tokenizer
from torch import Tensor

from qkov.circuits.heads import AttentionExample, attention_example
from qkov.data.tokenizer import token_string
from qkov.errors import QkovError
from qkov.model import Transformer
from qkov.names import head_name
from qkov.results import Results
from qkov.view.frame import View

Named = dict[str, list[list[float]]]


def _rows(name: str, pattern: object, n: int) -> list[list[float]]:
    """One head's pattern as the viewer's rows: ``src <= dest`` only, rounded as the report's."""
    matrix = torch.as_tensor(pattern, dtype=torch.float64)
    if matrix.shape != (n, n):
        raise QkovError(
            f"attention: {name}'s pattern is {list(matrix.shape)}, expected [{n}, {n}] for {n} tokens"
        )
    return [[round(float(x), 3) for x in row[: dest + 1]] for dest, row in enumerate(matrix)]


def named_patterns(patterns: object, n: int, batch_index: int = 0) -> Named:
    """``{"L0H0": rows, ...}`` from a mapping of head names to ``[dest, src]`` patterns, a list of
    per-layer ``[batch, n_heads, dest, src]`` tensors (:func:`qkov.frozen_patterns`), or one tensor
    ``[n_heads, dest, src]`` (layer 0) or ``[n_layers, n_heads, dest, src]``."""
    if isinstance(patterns, Mapping):
        return {str(name): _rows(str(name), p, n) for name, p in patterns.items()}
    if isinstance(patterns, Sequence) and patterns and isinstance(patterns[0], Tensor):
        layers = [layer[batch_index] for layer in patterns]
    elif isinstance(patterns, Tensor) and patterns.dim() in (3, 4):
        layers = list(patterns) if patterns.dim() == 4 else [patterns]
    else:
        raise QkovError(
            "attention: patterns must be a {head name: [dest, src]} mapping, qkov.frozen_patterns' list, "
            "or a tensor [n_heads, dest, src] or [n_layers, n_heads, dest, src]"
        )
    return {
        head_name(layer, head): _rows(head_name(layer, head), p, n)
        for layer, heads in enumerate(layers)
        for head, p in enumerate(heads)
    }


def _token_ids(model: Transformer, tokens: str | Sequence[int] | Tensor) -> Tensor:
    if isinstance(tokens, str):
        if model.tokenizer is None:
            raise QkovError("attention: this model has no tokenizer; give token ids instead of text")
        tokens = model.tokenizer.encode(tokens).ids
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    return model.check_tokens(ids[None])[0]


def _strings(tokenizer: Tokenizer | None, ids: list[int]) -> dict[int, str]:
    """How each token id in ``ids`` reads (the report's figure looks strings up by id)."""
    return {i: token_string(tokenizer, i) if tokenizer else f"#{i}" for i in ids}


def attention(tokens, patterns=None, description: str = "the given tokens", batch_index: int = 0) -> View:
    """The report's attention viewer inline: pick a head, hover a token to see where it attends,
    with every head's pattern drawn below.

    ``attention(strings, patterns)``: token strings (shown escaped) and patterns in any form
    :func:`named_patterns` reads. ``attention(model, tokens)``: the model's own patterns on
    ``tokens`` (text, read with the model's tokenizer, or token ids), from the report's
    :func:`~qkov.circuits.heads.attention_example`."""
    from qkov.report.sections import attention_figure

    if isinstance(tokens, Transformer):
        model, ids = tokens, _token_ids(tokens, patterns)
        with torch.no_grad():
            example = attention_example(model.eval(), ids, description)
        strings = _strings(model.tokenizer, example.tokens)
    else:
        strings = [str(s) for s in tokens]
        named = named_patterns(patterns, len(strings), batch_index)
        example = AttentionExample(description, list(range(len(strings))), named)
    if not example.patterns:
        raise QkovError("attention: no heads to show (a model with no layers has no attention)")
    return View(attention_figure(example, strings), f"attention on {description}")


HEAD_STEPS = ("copying", "copying_direct", "repeated_tokens", "induction_check")


def heads(source: Results | Transformer) -> View:
    """Every head's scores as the report and the explorer show them: the table of OV copying,
    direct copying, previous-token, induction and duplicate-token scores, the copying scores
    against their random baseline, and (two layers or more) the induction corner plot.

    ``source`` is a ``Results`` (:func:`qkov.load_results`, :func:`qkov.analyze.analyze`) or a
    model, whose scores are then computed by ``qkov analyze``'s own steps on its seeded inputs
    (:func:`qkov.analyze.run_steps`), so they are the numbers ``results.json`` would hold."""
    from qkov.analyze import STEPS, run_steps
    from qkov.report.sections import copying_section, heads_section, induction_section

    if isinstance(source, Transformer):
        if source.cfg.n_layers == 0:
            raise QkovError("heads: a model with no layers has no attention heads")
        applies = [s.name for s in STEPS if s.name in HEAD_STEPS and s.skip_reason(source.cfg, False) is None]
        done = run_steps(source, applies)
        source = Results(config=source.cfg, tokens=[], training=[], phase_change=None, **done)
    parts = [heads_section(source), copying_section(source), induction_section(source)]
    if not any(parts):
        raise QkovError("heads: these results hold no head scores (a model with no layers, or none analysed)")
    return View("".join(parts), "every head's scores")
