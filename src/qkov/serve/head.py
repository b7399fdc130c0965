"""Views of one head (sections "One-Layer Attention-Only Transformers" and "Two-Layer
Attention-Only Transformers"): its full OV circuit for a source token (the tokens it raises and
lowers, over the whole vocabulary), its full QK circuit for a destination token (the sources it
prefers), its skip-trigrams through a source or a destination, and every head's scores (copying
eigenvalues, previous-token, induction, duplicate-token), computed as ``qkov analyze`` computes
them, from the same functions and the same seeded batch.

Row-vector forms as everywhere in qkov: the full OV circuit is ``W_E W_V W_O W_U`` (paper:
``W_U W_OV W_E``), the full QK circuit ``W_E W_Q W_K^T W_E^T / sqrt(d_head)`` (paper:
``W_E^T W_QK W_E``), both kept factored and read a row at a time.

The head scores come from analyze's own steps (:func:`qkov.analyze.run_steps`) on its
seeded inputs, so the page shows the numbers ``results.json`` holds.
"""

from __future__ import annotations

from dataclasses import asdict

from qkov.analyze import run_steps
from qkov.circuits.skip_trigrams import SkipTrigram, head_circuits, skip_trigrams_through
from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

SEED = 0  # analyze's default seed: the same repeated random tokens, so the same scores


def ov_for_token(ex: Explorer, layer: int, head: int, token: int, k: int, progress: Progress) -> dict:
    """What attending to ``token`` makes the head write into the logits (its full OV circuit's
    row): the ``k`` outputs it raises and lowers most over the whole vocabulary (streamed top-k of
    the factored row), and where the token's own logit ranks (copying puts it first; None on a
    classifier, whose outputs are not tokens)."""
    progress.step(0, 1, "reading the OV circuit's row")
    row = ex.circuit_row("OV", layer, head, token)
    raised, lowered = row.topk(k), row.topk(k, largest=False)
    own = own_rank = None
    if ex.cfg.outputs_tokens:
        dense = row.AB[0]
        own = float(dense[token])
        own_rank = int((dense > own).sum()) + 1
    return {
        "token": {"id": token, "str": ex.strings[token]},
        "raised": ex.outputs_listed(raised.cols.tolist(), raised.values.tolist()),
        "lowered": ex.outputs_listed(lowered.cols.tolist(), lowered.values.tolist()),
        "own_logit": own,
        "own_rank": own_rank,
    }


def qk_for_token(ex: Explorer, layer: int, head: int, token: int, k: int, progress: Progress) -> dict:
    """Where the head looks from a destination ``token`` (its full QK circuit's row, the
    token-token term of the pre-softmax score): the sources it prefers and avoids most."""
    progress.step(0, 1, "reading the QK circuit's row")
    row = ex.circuit_row("QK", layer, head, token)
    preferred, avoided = row.topk(k), row.topk(k, largest=False)
    return {
        "token": {"id": token, "str": ex.strings[token]},
        "preferred": ex.listed(preferred.cols.tolist(), preferred.values.tolist()),
        "avoided": ex.listed(avoided.cols.tolist(), avoided.values.tolist()),
    }


def _trigram(ex: Explorer, t: SkipTrigram) -> dict:
    return {
        "source": {"id": t.source, "str": ex.strings[t.source]},
        "destination": {"id": t.destination, "str": ex.strings[t.destination]},
        "out": {"id": t.out, "str": ex.strings[t.out]},
        "qk": t.qk,
        "ov": t.ov,
        "strength": t.strength,
    }


def skip_trigrams(
    ex: Explorer,
    layer: int,
    head: int,
    source: int | None,
    destination: int | None,
    k: int,
    progress: Progress,
) -> dict:
    """The ``k`` strongest skip-trigrams ``source ... destination -> out`` through a given source
    or a given destination (exactly one: the app checks), as
    :func:`qkov.circuits.skip_trigrams.skip_trigrams_through` finds them in the head's centred
    circuits (:func:`head_circuits`, which :func:`~qkov.circuits.skip_trigrams.strongest_skip_trigrams`
    reads too): strength ``qk(destination, source) * ov(source, out)`` where both are positive.
    Through a destination the sources are streamed in blocks, and the job reports each block."""
    progress.step(0, 1, "centring the circuits")
    circuits = head_circuits(ex.circuit, layer, head)
    trigrams = skip_trigrams_through(
        circuits,
        source,
        destination,
        k,
        lambda done, total: progress.step(done, total, "each source's strongest outputs"),
    )
    return {"layer": layer, "head": head, "trigrams": [_trigram(ex, t) for t in trigrams]}


def head_scores(ex: Explorer, progress: Progress) -> dict:
    """Every head's scores as ``qkov analyze`` writes them, from analyze's own steps on analyze's
    seeded inputs: copying (OV eigenvalue positivity, its random baseline, eigenvalues, direct
    measures), previous-token, induction and duplicate-token scores on repeated random tokens, and
    each full OV circuit's spectrum (:func:`qkov.head_spectra`, top 10 singular values)."""
    if ex.cfg.n_layers == 0:
        raise QkovError("a model with no layers has no attention heads")
    progress.step(0, 3, "copying: OV eigenvalues, their random baseline and the direct measures")
    done = run_steps(ex.model, ["copying", "copying_direct"], seed=SEED)
    copying, direct = done["copying"], done["copying_direct"]
    progress.step(1, 3, "attention on repeated random tokens")
    repeated = run_steps(ex.model, ["repeated_tokens"], seed=SEED)["repeated_tokens"]
    progress.step(2, 3, "OV spectra")
    spectra = run_steps(ex.model, ["spectra"], seed=SEED)["spectra"].OV
    heads = [
        asdict(d)
        | asdict(c)
        | asdict(b)
        | {"singular_values": list(s.singular_values), "effective_rank": s.effective_rank}
        for c, d, b, s in zip(copying.heads, direct, repeated.heads, spectra, strict=True)
    ]
    return {
        "heads": heads,
        "copying_threshold": copying.threshold,
        "copying_baseline_mean": copying.baseline_mean,
        "repeat_period": repeated.period,
        "loss_per_repeat": repeated.loss_per_repeat,
        "previous_token_heads": repeated.previous_token_heads,
        "induction_heads": repeated.induction_heads,
        "previous_token_threshold": repeated.previous_token_threshold,
        "induction_threshold": repeated.induction_threshold,
    }
