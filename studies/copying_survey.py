"""Is the eigenvalue copying score a reliable test for copying? Every head with a square OV circuit
of every model given, set against the direct measures (section "Copying / Primarily Positive
Eigenvalues"; the survey behind ``docs/experiments/copying.md``).

For each model this runs ``qkov analyze``'s own steps (``copying``, ``copying_direct``,
``copying_comparison``: :mod:`qkov.circuits.copying`, the same rows, seed and budgets) and reads
three verdicts per head off them:

- *eigenvalues*: ``copying_score > COPYING_SCORE_THRESHOLD`` (0.5), the rule of ``compare_copying``;
- *diagonal*: ``diagonal_z > DIAGONAL_Z_THRESHOLD`` (1.0), the same rule's direct side;
- *self-top-1*: ``self_top1 > SELF_TOP1_MAJORITY`` (0.5): most tokens raise their own logit more
  than any other.

It prints one row per model (how many heads each verdict calls copying and how often the
eigenvalues disagree with each direct verdict), the totals by kind of model, the rank correlations
over all heads, and every disagreeing head with its numbers.

    python studies/copying_survey.py [--real-models DIR] [--gpt2-null] KIND:NAME=FOLDER ...

``--real-models DIR`` imports (into a temporary folder, never the repository) the models of
``/work/shared/real-models/`` whose OV circuits are square (README there); ``--gpt2-null`` adds a
randomly initialised GPT-2-shaped model (``induction_mechanism.gpt2_null``), the null case.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from host import machine  # studies/host.py, beside this script
from induction_mechanism import gpt2_null

import qkov
from qkov.analyze import run_steps
from qkov.circuits.copying import COPYING_SCORE_THRESHOLD, DIAGONAL_Z_THRESHOLD
from qkov.interop import import_checkpoint

SELF_TOP1_MAJORITY = 0.5
QKV = "(qkv n_heads d_head) d_model -> qkv n_heads d_model d_head"
FIRST_UNIQUE_CHAR = dict(
    n_layers=2, n_heads=3, d_model=42, d_head=14, n_ctx=20, d_vocab=11, attn_only=True, act_fn="relu",
    normalization_type="LN", positional_embedding_type="standard",
)  # fmt: skip  # the README's HookedTransformerConfig


def forming_induction_mapping(n_layers: int) -> dict:
    """The mapping of xanderchinxyz/forming-induction-heads' weights (README: a fused ``W_qkv``
    ``nn.Linear(64, 192)``, head-major, 4 heads of 16) onto qkov's names."""
    qkv = lambda index: {"from": "attention_blocks.{layer}.W_qkv.weight", "index": index,  # noqa: E731
                         "rearrange": QKV, "sizes": {"qkv": 3}}  # fmt: skip
    config = dict(n_layers=n_layers, n_heads=4, d_model=64, d_head=16, d_vocab=256, n_ctx=80,
                  positional_embedding="standard")  # fmt: skip
    tensors = {
        "W_E": "token_embedding.weight",
        "W_pos": "position_embedding",
        "blocks.{layer}.attn.W_Q": qkv(0),
        "blocks.{layer}.attn.W_K": qkv(1),
        "blocks.{layer}.attn.W_V": qkv(2),
        "blocks.{layer}.attn.W_O": {
            "from": "attention_blocks.{layer}.W_o.weight",
            "rearrange": "d_model (n_heads d_head) -> n_heads d_head d_model",
        },
        "W_U": {"from": "unembed.weight", "rearrange": "d_vocab d_model -> d_model d_vocab"},
    }
    return {"config": config, "tensors": tensors, "ignore": []}


def real_models(source: Path, tmp: Path) -> list[tuple[str, str, qkov.Transformer]]:
    """The square-OV models of ``source`` imported into ``tmp`` (the palindrome classifier has 2
    outputs over 33 inputs: no square OV circuit, so it is left out)."""
    out = []
    for name in ("1L_varied_model", "2L_fixed_model", "2L_varied_model_20000", "2L_varied_model_60000"):
        mapping = tmp / f"{name}.json"
        mapping.write_text(json.dumps(forming_induction_mapping(int(name[0]))))
        model, _ = import_checkpoint(source / f"{name}.pt", tmp / name, mapping=mapping)
        out.append(("real", name, model))
    config = tmp / "first_unique_char.json"
    config.write_text(json.dumps(FIRST_UNIQUE_CHAR))
    model, _ = import_checkpoint(source / "first_unique_char_model.pt", tmp / "fuc", config=config)
    out.append(("real", "first_unique_char", model))
    return out


def heads_of(model: qkov.Transformer) -> list[dict]:
    """Every head's eigenvalue score and direct measures, as ``qkov analyze`` computes them."""
    done = run_steps(model, ["copying_comparison"], seed=0)
    direct = {row.name: row for row in done["copying_direct"]}
    verdicts = {row.name: row for row in done["copying_comparison"]}
    rows = []
    for head in done["copying"].heads:
        d = direct[head.name]
        rows.append({
            "head": head.name,
            "score": head.copying_score,
            "above_baseline": head.copies,
            "diagonal_z": d.diagonal_z,
            "self_top1": d.self_top1,
            "self_rank": d.self_rank_median,
            "exact": d.exact,
            "eigenvalues": verdicts[head.name].eigenvalues_say_copying,
            "diagonal": verdicts[head.name].direct_says_copying,
            "top1": d.self_top1 > SELF_TOP1_MAJORITY,
        })  # fmt: skip
    return rows


def counts(rows: list[dict]) -> dict[str, int]:
    return {
        "heads": len(rows),
        "eigenvalues": sum(r["eigenvalues"] for r in rows),
        "diagonal": sum(r["diagonal"] for r in rows),
        "top1": sum(r["top1"] for r in rows),
        "vs diagonal": sum(r["eigenvalues"] != r["diagonal"] for r in rows),
        "diagonal only": sum(r["diagonal"] and not r["eigenvalues"] for r in rows),
        "vs top1": sum(r["eigenvalues"] != r["top1"] for r in rows),
        "top1 only": sum(r["top1"] and not r["eigenvalues"] for r in rows),
        "vs both": sum(r["eigenvalues"] != r["diagonal"] and r["eigenvalues"] != r["top1"] for r in rows),
    }


def row_line(kind: str, name: str, c: dict[str, int]) -> str:
    share = lambda k: f"{c[k]} ({100 * c[k] / c['heads']:.0f}%)"  # noqa: E731
    return (
        f"| {kind} | {name} | {c['heads']} | {c['eigenvalues']} | {c['diagonal']} | {c['top1']} "
        f"| {share('vs diagonal')}, {c['diagonal only']} | {share('vs top1')}, {c['top1 only']} "
        f"| {share('vs both')} |"
    )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties ranked by order: the measures are continuous)."""
    rank = lambda v: np.argsort(np.argsort(np.asarray(v)))  # noqa: E731
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


def report(surveyed: list[tuple[str, str, list[dict], float]]) -> None:
    header = "| kind | model | heads | eigenvalues say copying | diagonal z > 1 | self-top-1 > 0.5 "
    print(
        header + "| eigenvalues ≠ diagonal, of which direct only | eigenvalues ≠ self-top-1, of which "
        "direct only | ≠ both |\n|" + "---|" * 9
    )
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for kind, name, rows, _ in surveyed:
        print(row_line(kind, name, counts(rows)))
        by_kind[kind] += rows
    everything = [r for rows in by_kind.values() for r in rows]
    for kind, rows in [*by_kind.items(), ("all", everything)]:
        print(row_line(f"**{kind}**", "**total**", counts(rows)))
    scored = [r for r in everything if r["score"] is not None]
    scores = [r["score"] for r in scored]
    print(
        f"\nSpearman over the {len(scored)} heads with a score: eigenvalue score against diagonal z "
        f"{spearman(scores, [r['diagonal_z'] for r in scored]):+.2f}, against self-top-1 "
        f"{spearman(scores, [r['self_top1'] for r in scored]):+.2f}; diagonal z against self-top-1 "
        f"{spearman([r['diagonal_z'] for r in scored], [r['self_top1'] for r in scored]):+.2f}"
    )
    print(
        "\n| model | head | eigenvalue score | above baseline | diagonal z | self-top-1 | median self rank "
        "| disagrees with |\n|" + "---|" * 8
    )
    for _, name, rows, _ in surveyed:
        for r in rows:
            pairs = (("diagonal", "diagonal"), ("self-top-1", "top1"))
            which = [w for w, k in pairs if r[k] != r["eigenvalues"]]
            if which:
                score = "—" if r["score"] is None else f"{r['score']:+.3f}"
                print(
                    f"| {name} | {r['head']} | {score} | {'yes' if r['above_baseline'] else 'no'} "
                    f"| {r['diagonal_z']:+.2f} | {r['self_top1']:.3f}{'' if r['exact'] else ' (sampled)'} "
                    f"| {r['self_rank']:.0f} | {', '.join(which)} |"
                )
    print("\nseconds per model: " + ", ".join(f"{name} {seconds:.1f}" for _, name, _, seconds in surveyed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="KIND:NAME=FOLDER (a qkov checkpoint folder)")
    parser.add_argument("--real-models", type=Path, help="import the square-OV models of this folder")
    parser.add_argument("--gpt2-null", action="store_true", help="add a random GPT-2-shaped imported model")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {machine()}, {torch.get_num_threads()} thread(s)")
    print(
        f"rules: eigenvalues > {COPYING_SCORE_THRESHOLD}, diagonal z > {DIAGONAL_Z_THRESHOLD}, "
        f"self-top-1 > {SELF_TOP1_MAJORITY}\n"
    )
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        models = [(given.partition(":")[0], *given.partition(":")[2].split("=", 1)) for given in args.models]
        loaded = [(kind, name, qkov.load(path)) for kind, name, path in models]
        if args.real_models:
            loaded += real_models(args.real_models, tmp)
        if args.gpt2_null:
            loaded.append(("null", "GPT-2-shaped, random", gpt2_null(tmp / "gpt2", 0)))
        surveyed = []
        for kind, name, model in loaded:
            start = time.time()
            surveyed.append((kind, name, heads_of(model.eval()), time.time() - start))
    report(surveyed)


if __name__ == "__main__":
    main()
