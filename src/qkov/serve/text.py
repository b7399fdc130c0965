"""Views of one sequence, typed or a row of the user's data: its tokens, every head's attention
pattern, each position's prediction, target and loss, and the path expansion of the logits at one
position (sections "Transformer Overview" and "Path Expansion of Logits"). Each calls the model and
:func:`qkov.path_expansion` as analyze does.

Targets are per position as in :mod:`qkov.data.user_tokens`: position ``i``'s prediction is scored
against ``targets[i]``, ``-100`` where there is none. A typed text's targets are its next tokens
(the last position has none); a classifier's typed text has none at all, and so no loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkov.circuits.paths import BIAS, path_expansion
from qkov.circuits.task import scored
from qkov.data.user_tokens import IGNORE, next_token_targets
from qkov.errors import QkovError
from qkov.hooks import patterns_only
from qkov.names import head_name, hook_name
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

# (n_heads + 1) ** n_layers terms, each a [pos, d_vocab] logit tensor: 1024 is a 5-layer, 3-head model
MAX_PATHS = 1024
MAX_PATH_BYTES = 512 * 2**20  # all the terms' logits of one expansion: 2 of them at once fit a laptop
DIGITS = 4  # attention weights and losses as the page shows them


def typed_targets(ex: Explorer, ids: list[int]) -> tuple[list[int] | None, str | None]:
    """A typed text's targets, its next tokens; on a classifier none, and the one line saying why."""
    if ex.cfg.outputs_tokens:
        return next_token_targets(torch.tensor([ids]))[0].tolist(), None
    return None, (
        f"no loss: the model's {ex.cfg.d_out} outputs are classes (d_vocab_out), not next tokens, so a typed "
        "text has no targets (start the explorer with --tokens and --targets to score its task)"
    )


def run_text(ex: Explorer, ids: list[int], targets: list[int] | None, progress: Progress) -> dict:
    """The tokens, every head's pattern (``patterns[head][dest][src]``, ``src <= dest``), and per
    position the model's top prediction, the target (None: ``-100``, or ``targets`` None), the
    loss of the prediction against it and whether the top prediction is it; the mean loss and the
    accuracy over the positions with a target (as :func:`qkov.circuits.task.scored` scores a task)."""
    progress.step(0, 1, "running the model")
    tokens = torch.tensor([ids])
    wanted = torch.tensor([targets]) if targets is not None else torch.full_like(tokens, IGNORE)
    with torch.no_grad():
        logits, cache = ex.model.run_with_cache(tokens, names_filter=patterns_only)
        losses = F.cross_entropy(logits[0], wanted[0], ignore_index=IGNORE, reduction="none")
    patterns = {}
    for layer in range(ex.cfg.n_layers):
        for head, pattern in enumerate(cache[hook_name(layer, "pattern")][0].round(decimals=DIGITS)):
            patterns[head_name(layer, head)] = [row[: dest + 1] for dest, row in enumerate(pattern.tolist())]
    predicted, target = logits[0].argmax(-1).tolist(), wanted[0].tolist()
    has = [t != IGNORE for t in target]
    mean_loss = accuracy = None
    if any(has):
        mean_loss, accuracy, _ = scored(logits, wanted)
    return {
        "tokens": [{"id": i, "str": ex.strings[i]} for i in ids],
        "patterns": patterns,
        "prediction": [ex.output(i) for i in predicted],
        "target": [ex.output(t) if h else None for t, h in zip(target, has, strict=True)],
        "loss": [round(float(x), DIGITS) if h else None for x, h in zip(losses, has, strict=True)],
        "correct": [p == t if h else None for p, t, h in zip(predicted, target, has, strict=True)],
        "mean_loss": mean_loss,
        "accuracy": accuracy,
    }


def path_name(path: tuple[str, ...] | str) -> str:
    if path == BIAS:
        return "bias"
    return " → ".join(path) if path else "direct"


def check_paths(ex: Explorer, ids: list[int], pos: int) -> None:
    """Refuse a position outside the text, or an expansion with too many paths or logits."""
    if not 0 <= pos < len(ids):
        raise QkovError(f"position {pos} out of range: the text has positions 0 to {len(ids) - 1}")
    n_paths = (ex.cfg.n_heads + 1) ** ex.cfg.n_layers
    if n_paths > MAX_PATHS:
        raise QkovError(
            f"this model has {n_paths} paths ((n_heads + 1) ** n_layers), more than the {MAX_PATHS} "
            "the explorer expands one by one"
        )
    size = n_paths * (pos + 1) * ex.cfg.d_out * ex.model.W_U.element_size()
    if size > MAX_PATH_BYTES:
        raise QkovError(
            f"the path expansion up to position {pos} needs {size / 2**20:.0f} MiB of logits, more than "
            f"the {MAX_PATH_BYTES // 2**20} MiB the explorer allows; choose an earlier position"
        )


def path_terms(
    ex: Explorer, ids: list[int], targets: list[int] | None, pos: int, k: int, progress: Progress
) -> dict:
    """Every path's share of the logits at ``pos`` (they sum to the model's logits): its top
    ``k`` outputs and its logit for the model's prediction and for the target at ``pos`` (none
    where ``targets`` is None or says ``-100``). The expansion runs on ``ids[: pos + 1]``, which
    gives the same terms at ``pos`` (attention is causal)."""
    check_paths(ex, ids, pos)
    progress.step(0, 1, "expanding the logits into paths")
    terms = {
        path: logits[0, pos]
        for path, logits in path_expansion(ex.model, torch.tensor([ids[: pos + 1]])).items()
    }
    total = sum(terms.values())
    predicted = int(total.argmax())
    target = targets[pos] if targets is not None and targets[pos] != IGNORE else None
    rows = []
    for path, logits in terms.items():
        top = logits.topk(k)
        rows.append(
            {
                "path": path_name(path),
                "order": len(path) if path != BIAS else None,
                "predicted_logit": float(logits[predicted]),
                "target_logit": None if target is None else float(logits[target]),
                "top": ex.outputs_listed(top.indices.tolist(), top.values.tolist()),
            }
        )
    key = "target_logit" if target is not None else "predicted_logit"
    rows.sort(key=lambda row: -abs(row[key]))
    return {
        "position": pos,
        "token": {"id": ids[pos], "str": ex.strings[ids[pos]]},
        "predicted": ex.output(predicted) | {"logit": float(total[predicted])},
        "target": None if target is None else ex.output(target) | {"logit": float(total[target])},
        "sorted_by": key,
        "terms": rows,
    }
