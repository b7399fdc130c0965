"""``qkov analyze``: every analysis of one model, written as results.json and report.html."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from qkov.cli.common import (
    CHECKPOINT_HELP,
    DEVICES,
    add_corpus_argument,
    add_text_field_argument,
    checked_checkpoint,
    checked_weights,
    common_options,
    console,
    set_threads,
)
from qkov.errors import QkovError

if TYPE_CHECKING:
    from qkov.data.user_tokens import UserFiles
    from qkov.distributed import Processes
    from qkov.results import Results


def add_analyze_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        parents=[common_options(f"where to analyse: {DEVICES} (the same numbers, to float rounding)")],
        help="run every analysis for a checkpoint's depth; write results.json and report.html",
        description="Run every analysis that applies to the checkpoint's depth and write "
        "DIR/results.json and DIR/report.html.",
    )
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "--out",
        help="output folder (default: CHECKPOINT/analysis; for a model from the Hugging Face cache, "
        "analysis/org--name here)",
    )
    add_corpus_argument(
        p,
        "text, .jsonl(.gz/.zst) or .parquet files, folders or globs (repeatable), or 'stdlib' for the "
        "embedded default corpus: "
        "adds the bigram comparison and checks skip-trigram bugs against the text",
    )
    add_text_field_argument(p)
    add_user_data_arguments(
        p,
        "adds the task's loss, accuracy and head ablations; term importance and an attention example "
        "run on them",
    )
    p.add_argument(
        "--weights-only",
        action="store_true",
        help="run only the steps that read the weights alone: no forward pass, no tokens; safetensors "
        "weights are read one layer at a time, so memory does not grow with the depth",
    )
    p.add_argument(
        "--lazy",
        action="store_true",
        help="read safetensors weights one layer at a time for every step, as --weights-only does: "
        "memory grows with the width and the batch, not the depth (but for the ablation step's backward "
        "pass), and each forward pass reads every layer again from the mapped files (slower); for a "
        "model too big to hold in float32",
    )
    p.add_argument(
        "--steps",
        metavar="A,B,...",
        type=step_names,
        help="run only these steps (and the steps whose results they read, said in the output); "
        "results.json and the report say which ran",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="with --weights-only: processes on this machine (launches torchrun), each analysing a share "
        "of the layers for spectra and eigenvalue and direct copying; the results are one process's",
    )


def step_names(text: str) -> list[str]:
    """``--steps a,b,c``: the names, in order, without blanks or repeats."""
    return list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def default_analysis_folder(source: str, folder: Path) -> Path:
    """Where ``qkov analyze`` writes without ``--out``: ``CHECKPOINT/analysis``, except for a model
    from the Hugging Face cache (never written into): ``analysis/org--name[@revision]`` here."""
    from qkov.hub_cache import hub_name

    name = hub_name(source)
    if name is None or folder == Path(source):
        return Path(source) / "analysis"
    return Path("analysis") / str(name).replace("/", "--")


def add_user_data_arguments(p: argparse.ArgumentParser, use: str) -> None:
    """``--tokens FILE`` (what they add to the command: ``use``) and ``--targets FILE``."""
    p.add_argument(
        "--tokens",
        metavar="FILE",
        help="your own sequences of token ids [batch, pos] (.npy, .safetensors, .pt, or .jsonl with a list "
        f"of ids per line): {use}",
    )
    p.add_argument(
        "--targets",
        metavar="FILE",
        help="the target at each position of --tokens, same formats and shape, -100 for none "
        "(default: the next token)",
    )


def analyze_command(args: argparse.Namespace) -> None:
    if args.nproc < 1:
        raise QkovError(f"--nproc must be at least 1, got {args.nproc}")
    if args.nproc > 1 and not args.weights_only:
        raise QkovError("--nproc splits the steps that read the weights alone: use it with --weights-only")
    if args.steps is not None or args.weights_only:  # a choice that cannot run is told first
        from qkov.analyze import check_selection

        check_selection(args.steps, args.weights_only, bool(args.corpus), args.tokens is not None)
    folder = checked_checkpoint(args.checkpoint)  # a mistyped path is told before torch loads
    from qkov.data.user_tokens import read_user_files

    files = read_user_files(args.tokens, args.targets)  # a bad file too, before the model opens
    from qkov.interop.lazy import reads_lazily

    if args.lazy and not (folder.is_dir() and reads_lazily(folder)):
        raise QkovError(f"{args.checkpoint}: --lazy reads Hugging Face and qkov safetensors folders only")
    from qkov.distributed import default_threads, launched_by_torchrun, process_group, run_workers
    from qkov.io import atomic_write_text, check_writable_folder
    from qkov.machine import compute_device
    from qkov.report import render_report
    from qkov.results import write_results

    set_threads(args.threads, default_threads(args.nproc))
    out = check_writable_folder(args.out if args.out else default_analysis_folder(args.checkpoint, folder))
    if args.nproc > 1 and not launched_by_torchrun():
        opened_for_errors(folder, args.checkpoint)  # a bad checkpoint is one line here, not N in workers
        status, interrupted = run_workers(args.nproc, args.argv)
        if interrupted:
            raise KeyboardInterrupt
        if status:
            raise QkovError(f"analysis processes failed (torchrun exit status {status}); see above")
        return
    with process_group(compute_device(args.device)) as processes:
        results = analysed(args, folder, processes, files)
    if not processes.is_main:  # rank 0 alone writes and prints
        return
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    atomic_write_text(out / "report.html", render_report({f"{results.config.n_layers}-layer": results}))
    for line in summary_lines(results):
        console.print(line, highlight=False)
    console.print(f"wrote {out / 'results.json'} and {out / 'report.html'}")


def opened_for_errors(folder: Path, source: str) -> None:
    """Open the checkpoint lazily, when it can be (its headers, shapes and ends read and checked,
    no layer), and let it go: what is wrong with it is then said once, by this process."""
    from qkov.interop import open_model
    from qkov.interop.lazy import reads_lazily

    if reads_lazily(folder):
        checked_weights(open_model(folder, lazy=True), source)


def analysed(
    args: argparse.Namespace, folder: Path, processes: Processes, files: UserFiles | None
) -> Results:
    """The checkpoint in ``folder`` opened (lazily with ``--weights-only`` when its weights can be
    mapped) and analysed, with the user's ``files`` checked against it; under torchrun each of
    ``processes`` computes its share of the layers."""
    from qkov.analyze import analyze
    from qkov.data.shards import corpus_tokens
    from qkov.data.user_tokens import checked_user_tokens
    from qkov.distributed import worker_device
    from qkov.interop import open_model as load
    from qkov.interop.lazy import reads_lazily
    from qkov.machine import compute_device, return_freed_blocks
    from qkov.training_log import read_training_log

    # no forward pass, or one asked for layer by layer: one layer in memory at a time
    lazy = (args.weights_only or args.lazy) and reads_lazily(folder)
    if lazy:
        return_freed_blocks()  # each layer's temporaries go back to the system, not to glibc's heap
    device = worker_device(compute_device(args.device), processes)
    model = checked_weights(load(folder, lazy=lazy), args.checkpoint).to(device)
    show = not args.quiet and processes.is_main
    if lazy and processes.is_main:
        flag = "--weights-only" if args.weights_only else "--lazy"
        console.print(f"weights read layer by layer from the mapped files ({flag})", highlight=False)
    corpus = None
    if args.corpus:
        if model.tokenizer is None:
            raise QkovError("--corpus needs a checkpoint with a tokenizer.json to read text")
        corpus = corpus_tokens(args.corpus, model.tokenizer, args.text_field, show)
    user = None if files is None else checked_user_tokens(files, model.cfg)
    log = read_training_log(folder)
    return analyze(model, corpus, log, show, args.seed, user, args.steps, args.weights_only)


def summary_lines(results: Results) -> list[str]:
    """A few lines a person reads first: the headline numbers of one model's results."""
    cfg = results.config
    lines = [f"{cfg.n_layers}-layer model, {cfg.n_heads} heads per layer, d_model {cfg.d_model}"]
    if cfg.source != "qkov" or cfg.normalization != "none" or cfg.d_mlp:
        lines[0] += f" (from {cfg.source}; normalization {cfg.normalization}; d_mlp {cfg.d_mlp})"
    if (b := results.bigram) is not None:
        correlation = "undefined" if b.correlation is None else f"{b.correlation:.3f}"
        lines.append(f"  direct path vs corpus bigrams: correlation {correlation}, KL {b.kl:.3f} nats")
    if (c := results.copying) is not None:
        lines.append(f"  copying heads: {c.copying_heads} of {len(c.heads)} (threshold {c.threshold:+.2f})")
    if (t := results.repeated_tokens) is not None:
        lines.append("  loss on repeated random tokens: " + " / ".join(f"{x:.2f}" for x in t.loss_per_repeat))
        copying = {h.name: h.copying_score for h in c.heads} if c is not None else {}
        for h in t.heads:
            if h.name in t.previous_token_heads or h.name in t.induction_heads:
                lines.append(
                    f"  {h.name}: previous-token {h.previous_token_score:.2f}, "
                    f"induction {h.induction_score:.2f}, copying {copying.get(h.name) or 0.0:+.2f}"
                )
    return lines + task_lines(results)


def task_lines(results: Results) -> list[str]:
    """The task's numbers on the user's data (and the heads whose ablation costs most), the steps
    that ran when they were chosen (and those run because a chosen one reads them), and the
    analyses that were skipped, one line per reason."""
    from qkov.results import EVERY_STEP

    lines = []
    if (task := results.task) is not None:
        lines.append(
            f"  task on {task.data}: loss {task.loss:.4f} nats, accuracy {task.accuracy:.4f}, "
            f"mean target probability {task.mean_target_probability:.4f} ({task.positions} positions)"
        )
        worst = sorted(task.ablations, key=lambda a: -a.loss_change)[:3]
        if worst:
            lines.append(
                "  ablations costing most: "
                + ", ".join(
                    f"{a.head} ({a.mode}) {a.loss_change:+.3f} nats, accuracy {a.accuracy_change:+.3f}"
                    for a in worst
                )
            )
    if (steps := results.steps) is not None and steps.chosen != EVERY_STEP:
        lines.append(f"  ran {', '.join(steps.ran) or 'no step'}: {steps.chosen}")
        lines += [f"  also ran {name}: {why}" for name, why in steps.added.items()]
    by_reason: dict[str, list[str]] = {}
    for name, reason in results.skipped.items():
        by_reason.setdefault(reason, []).append(name)
    lines += [f"  skipped ({reason}): {', '.join(names)}" for reason, names in by_reason.items()]
    return lines
