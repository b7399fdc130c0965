"""Which induction mechanism, under which position scheme: the survey behind
``docs/experiments/induction-mechanism.md`` (the paper's open question: one GPT-2 induction head works
by "pointer arithmetic" on positions, not by K-composition with a previous-token head).

For every model given as ``NAME=FOLDER`` (a qkov checkpoint folder), this runs ``qkov analyze``'s own
``induction_mechanism`` step (same seeded repeated random tokens, same budget, same rule:
:mod:`qkov.circuits.mechanisms`) and prints one row per induction head (induction score above
``repeated_tokens.induction_threshold``). A model with no head above it gets one row for its
best later-layer head, marked ``(below threshold)``, classified by the same rule, so a null model
still shows what its best head does. ``--gpt2-null`` adds a randomly initialised Hugging Face
``GPT2LMHeadModel`` (built locally, saved and imported with ``qkov import``: LayerNorm, MLPs,
biases, learned positions), the null case.

    .venv/bin/python studies/induction_mechanism.py --gpt2-null \\
        shortformer=/tmp/h4-models/short2 standard=/tmp/h4-models/std2 ...
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from functools import partial
from pathlib import Path

import torch

import qkov
from qkov.analyze import run_steps
from qkov.circuits.attribution import variance_shares
from qkov.circuits.composition import composition_scores
from qkov.circuits.heads import pattern_offset_attention
from qkov.circuits.mechanisms import InductionMechanism, induction_mechanism_flop, induction_mechanisms
from qkov.circuits.repeated import repeated_token_behaviour
from qkov.context import REPEAT_BATCH, REPEATS, Context
from qkov.data.random_tokens import repeated_random_tokens
from qkov.interop import import_checkpoint
from qkov.names import hook_name, parse_head


def gpt2_null(folder: Path, seed: int) -> qkov.Transformer:
    """A random GPT-2-style model (4 layers x 4 heads, d_model 128, 512 tokens, n_ctx 96) imported."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=128, n_positions=96, vocab_size=512)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder / "hf", safe_serialization=True)
    model, _ = import_checkpoint(folder / "hf", folder / "qkov")
    return model


def rows_for(
    model: qkov.Transformer, seed: int, period: int | None
) -> list[tuple[float, bool, InductionMechanism]]:
    """``(induction score, above threshold, mechanism)`` for each induction head, or for the best
    later-layer head when none passes. With ``period`` (a model trained on one period), on
    ``REPEAT_BATCH`` sequences of that period drawn from ``seed`` instead of ``analyze``'s."""
    if period is None:
        done = run_steps(model, ["induction_mechanism"], seed=seed)
        behaviour, rows = done["repeated_tokens"], done["induction_mechanism"]
        ctx = Context.of(model, None, seed, {})
        tokens, period, described = ctx.rerun_batch(partial(induction_mechanism_flop, model.cfg, heads=1))
    else:
        generator = torch.Generator().manual_seed(seed)
        tokens = repeated_random_tokens(REPEAT_BATCH, period, REPEATS, model.cfg.d_vocab, generator)
        behaviour, described = (
            repeated_token_behaviour(model, tokens, period, REPEATS),
            "repeated random tokens",
        )
        rows = induction_mechanisms(model, tokens, period, behaviour.induction_heads, described)
    scores = {h.name: h.induction_score or 0.0 for h in behaviour.heads}
    if rows:
        return [(scores[row.head], True, row) for row in rows]
    best = max((h for h in behaviour.heads if h.layer > 0), key=lambda h: h.induction_score or 0.0).name
    (row,) = induction_mechanisms(model, tokens, period, [best], described)
    return [(scores[best], False, row)]


def writer_of(part: str) -> str:
    """The writer a part belongs to: an earlier head's parts (``L0H1``, ``L0H1.pos``...) are its."""
    return part.split(".")[0]


def unique_char_terms(folder: str, seed: int) -> None:
    """The issue's model (``first_unique_char_model.pt``, imported to ``folder``): on its own inputs
    (token 10, then 19 random tokens of 0..9), each layer-1 head's share of the row-centred score
    variation (:func:`qkov.circuits.attribution.variance_shares`) from each earlier head on the key
    side (K-composition: every query part x that head's parts) and on the query side
    (Q-composition), beside the head pair's K-composition score (baseline subtracted)."""
    model = qkov.load(folder).eval()
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.cat([torch.full((64, 1), 10), torch.randint(0, 10, (64, 19), generator=generator)], 1)
    scores = composition_scores(model, "K")
    print("\n| head | earlier head | K-composition score | key-side share | query-side share |")
    print("|---|---|---|---|---|")
    for head in range(model.cfg.n_heads):
        shares = variance_shares(qkov.score_attribution(model, tokens, f"L1H{head}"))
        for writer in range(model.cfg.n_heads):
            name = f"L0H{writer}"
            keys = sum(v for (_, k), v in shares.items() if writer_of(k) == name)
            queries = sum(v for (q, _), v in shares.items() if writer_of(q) == name)
            score = float(scores[0, writer, 1, head])
            print(f"| L1H{head} | {name} | {score:+.3f} | {keys:+.2f} | {queries:+.2f} |")


def unrepeated_offset_attention(model: qkov.Transformer, row: InductionMechanism, seed: int) -> float:
    """The head's mean attention to ``dest - period + 1`` on random tokens that do *not* repeat: near 0
    for a head that finds the target by content (K-composition, or a pointer looked up by content),
    as high as on repeats for a head that attends at a fixed offset whatever the tokens."""
    generator = torch.Generator().manual_seed(seed + 2)
    tokens = torch.randint(1, model.cfg.d_vocab, (REPEAT_BATCH, REPEATS * row.period), generator=generator)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    layer, head = parse_head(row.head)
    scores = pattern_offset_attention(cache[hook_name(layer, "pattern")], row.period - 1, row.period)
    return float(scores[head])


def share(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def print_rows(name: str, model: qkov.Transformer, period: int | None, seed: int) -> None:
    """The survey table's rows for one model."""
    cfg = model.cfg
    for score, above, row in rows_for(model, seed, period):
        top, s = row.top_terms[0], row.shares
        head = row.head + ("" if above else " (below threshold)")
        offset = unrepeated_offset_attention(model, row, seed)
        print(
            f"| {name} | {cfg.positional_embedding} | {cfg.normalization} | {head} | {score:.2f} "
            f"| {offset:.2f} | {row.mechanism} | {share(s['k_composition'])} | {share(s['pointer'])} "
            f"| {share(s['other'])} | {row.margin:.2f} | {row.writer} "
            f"| {top.query} × {top.key} {share(top.share)} | {row.tokens}, period {row.period} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "models",
        nargs="*",
        help="NAME=FOLDER (a qkov checkpoint folder), or NAME=FOLDER@PERIOD for one period",
    )
    parser.add_argument("--seed", type=int, default=0, help="the analysis seed (repeated random tokens)")
    parser.add_argument(
        "--unique-char", metavar="FOLDER", help="the issue's model, imported: its score terms"
    )
    parser.add_argument("--gpt2-null", action="store_true", help="add a random GPT-2-style imported model")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} with {torch.get_num_threads()} thread(s); seed {args.seed}"
    )
    models = []
    for given in args.models:
        name, _, rest = given.partition("=")
        folder, _, period = rest.partition("@")
        models.append((name, qkov.load(folder), int(period) if period else None))
    with tempfile.TemporaryDirectory() as tmp:
        if args.gpt2_null:
            models.append(("GPT-2-style, random (null)", gpt2_null(Path(tmp), args.seed), None))
        header = "| model | positions | LN | head | induction score | no-repeat offset | mechanism | K-comp "
        print(header + "| pointer | other | margin | writer | largest term | tokens |")
        print("|" + "---|" * 14)
        for name, model, period in models:
            print_rows(name, model.eval(), period, args.seed)
    if args.unique_char:
        unique_char_terms(args.unique_char, args.seed)


if __name__ == "__main__":
    main()
