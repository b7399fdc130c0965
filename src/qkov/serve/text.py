"""Views of a typed text: its tokens, every head's attention pattern, the loss per token, and the
path expansion of the logits at one position (sections "Transformer Overview" and "Path Expansion
of Logits"). Each calls the model and :func:`qkov.path_expansion` as analyze does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkov.circuits.paths import BIAS, path_expansion
from qkov.errors import QkovError
from qkov.names import head_name, hook_name
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

# (n_heads + 1) ** n_layers terms, each a [pos, d_vocab] logit tensor: 1024 is a 5-layer, 3-head model
MAX_PATHS = 1024
MAX_PATH_BYTES = 512 * 2**20  # all the terms' logits of one expansion: 2 of them at once fit a laptop
DIGITS = 4  # attention weights and losses as the page shows them


def run_text(ex: Explorer, ids: list[int], progress: Progress) -> dict:
    """The tokens, every head's pattern (``patterns[head][dest][src]``, ``src <= dest``), the loss
    of predicting each token from the ones before it (None for the first), and the model's top
    prediction after each position."""
    progress.step(0, 1, "running the model")
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits, cache = ex.model.run_with_cache(tokens)
        losses = F.cross_entropy(logits[0, :-1], tokens[0, 1:], reduction="none")
    patterns = {}
    for layer in range(ex.cfg.n_layers):
        for head, pattern in enumerate(cache[hook_name(layer, "pattern")][0].round(decimals=DIGITS)):
            patterns[head_name(layer, head)] = [row[: dest + 1] for dest, row in enumerate(pattern.tolist())]
    predicted = logits[0].argmax(-1).tolist()
    return {
        "tokens": [{"id": i, "str": ex.strings[i]} for i in ids],
        "patterns": patterns,
        "loss": [None] + [round(float(x), DIGITS) for x in losses],
        "mean_loss": float(losses.mean()) if len(ids) > 1 else None,
        "prediction": [{"id": i, "str": ex.strings[i]} for i in predicted],
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
    size = n_paths * (pos + 1) * ex.cfg.d_vocab * ex.model.W_U.element_size()
    if size > MAX_PATH_BYTES:
        raise QkovError(
            f"the path expansion up to position {pos} needs {size / 2**20:.0f} MiB of logits, more than "
            f"the {MAX_PATH_BYTES // 2**20} MiB the explorer allows; choose an earlier position"
        )


def path_terms(ex: Explorer, ids: list[int], pos: int, k: int, progress: Progress) -> dict:
    """Every path's share of the logits at ``pos`` (they sum to the model's logits): its top
    ``k`` tokens and its logit for the model's prediction and for the actual next token. The
    expansion runs on ``ids[: pos + 1]``, which gives the same terms at ``pos`` (attention is
    causal)."""
    check_paths(ex, ids, pos)
    progress.step(0, 1, "expanding the logits into paths")
    terms = {
        path: logits[0, pos]
        for path, logits in path_expansion(ex.model, torch.tensor([ids[: pos + 1]])).items()
    }
    total = sum(terms.values())
    predicted = int(total.argmax())
    target = ids[pos + 1] if pos + 1 < len(ids) else None
    rows = []
    for path, logits in terms.items():
        top = logits.topk(k)
        rows.append(
            {
                "path": path_name(path),
                "order": len(path) if path != BIAS else None,
                "predicted_logit": float(logits[predicted]),
                "target_logit": None if target is None else float(logits[target]),
                "top": ex.listed(top.indices.tolist(), top.values.tolist()),
            }
        )
    key = "target_logit" if target is not None else "predicted_logit"
    rows.sort(key=lambda row: -abs(row[key]))
    return {
        "position": pos,
        "token": {"id": ids[pos], "str": ex.strings[ids[pos]]},
        "predicted": {"id": predicted, "str": ex.strings[predicted], "logit": float(total[predicted])},
        "target": None
        if target is None
        else {"id": target, "str": ex.strings[target], "logit": float(total[target])},
        "sorted_by": key,
        "terms": rows,
    }
