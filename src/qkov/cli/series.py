"""``qkov series``: the phase change measured over a run's saved checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkov.cli.common import (
    DEVICES,
    add_corpus_argument,
    add_text_field_argument,
    common_options,
    console,
    set_threads,
)


def add_series_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "series",
        parents=[common_options(f"where to evaluate: {DEVICES}")],
        help="judge the phase change of a run from a folder of its checkpoints; write a report",
        description="Measure every checkpoint of SRC (weights files or qkov checkpoint folders whose names "
        "end in their step or tokens, e.g. model_20000.pth) as qkov's trainer measures its evaluations, "
        "judge the induction phase change by the rule metrics.jsonl is judged by, and write "
        "DIR/series.jsonl, DIR/results.json and DIR/report.html. Rerun to continue an interrupted series.",
    )
    p.set_defaults(seed=None)
    p.add_argument("src", help="the folder of checkpoints")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--config", help="the weights files' config.json (default: the one in SRC)")
    p.add_argument("--mapping", help="a JSON file mapping the weights' keys to qkov's (see qkov import)")
    p.add_argument("--control", metavar="SRC1", help="a 1-layer series: the control that decides the verdict")
    p.add_argument("--control-config", help="the control's config.json (default: the one in SRC1)")
    p.add_argument("--control-mapping", help="the control's mapping")
    p.add_argument(
        "--label", choices=["steps", "tokens"], default="steps", help="what the names' numbers count"
    )
    p.add_argument("--tokens-per-step", type=int, help="tokens of one training step (batch size x context)")
    p.add_argument(
        "--eval-tokens", type=int, help="held-out tokens scored at each checkpoint (default 32768)"
    )
    add_corpus_argument(
        p,
        "held-out text: files, folders or globs (repeatable), or 'stdlib', read through the checkpoints' "
        "tokenizer; default: repeating random tokens",
    )
    add_text_field_argument(p)


def series_command(args: argparse.Namespace) -> None:
    from qkov.io import atomic_write_text, check_writable_folder
    from qkov.report import render_report
    from qkov.results import write_results
    from qkov.series import SeriesRun, SeriesSource, run_series, series_results, verdict_lines

    set_threads(args.threads)
    check_writable_folder(args.out)
    paths = (args.config, args.mapping, args.control_config, args.control_mapping)
    config, mapping, control_config, control_mapping = (Path(p) if p else None for p in paths)
    control = SeriesSource(Path(args.control), control_config, control_mapping) if args.control else None
    run = SeriesRun(
        SeriesSource(Path(args.src), config, mapping), Path(args.out), args.label, args.tokens_per_step,
        control, args.corpus, args.text_field, args.seed, args.eval_tokens, args.device,
    )  # fmt: skip
    result = run_series(run, show_progress=not args.quiet)
    models = series_results(result)
    write_results(next(iter(models.values())), run.out)
    atomic_write_text(run.out / "report.html", render_report(models))
    for line in verdict_lines(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"wrote {run.out / 'series.jsonl'}, {run.out / 'results.json'} and {run.out / 'report.html'}",
        highlight=False,
        soft_wrap=True,
    )
