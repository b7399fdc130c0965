"""The ``qkov`` command: thin argument parsing around the library.

Every :class:`QkovError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

import torch
from rich.console import Console

from qkov.config import ACT_FNS, NORMALIZATIONS, POSITIONAL_EMBEDDINGS
from qkov.errors import QkovError
from qkov.recipes import PRESETS
from qkov.results import EVERY_STEP, Results

console = Console(stderr=True)


def one_line(message: str) -> str:
    """``message`` with every character that is not printable (a newline or carriage return in a
    file's field name, say) escaped, so the error stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line and exit status 2, as every other bad input
    (argparse prints its usage first; ``--help`` still shows it)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("qkov").strip()
        where = f"{command}: " if command else ""
        print(f"qkov: error: {one_line(where + message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def add_corpus_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--corpus", action="append", metavar="PATH", help=help)


def add_text_field_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-field", default="text", help="the text's field in .jsonl and column in .parquet")


def add_threads_argument(p: argparse.ArgumentParser, help: str = "CPU threads (default: all cores)") -> None:
    p.add_argument("--threads", type=int, help=help)


def common_options(device_help: str) -> argparse.ArgumentParser:
    """The options every long-running command shares: ``--seed``, ``--threads``, ``--quiet`` and
    ``--device`` (its help says what the command computes there)."""
    p = Parser(add_help=False)
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_threads_argument(p, "CPU threads (default: all cores; for train, per process)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--device", default="cpu", help=device_help)
    return p


DEVICES = "cpu (default), cuda, cuda:1, ..."
CHECKPOINT_HELP = (
    "checkpoint folder (config.json, model.safetensors, [tokenizer.json]), or a model's Hugging Face name "
    "org/name[@revision], read from the local cache (never downloaded)"
)


def most_threads() -> int:
    """The most CPU threads a command takes: 8 per core (more only slows a CPU down)."""
    return 8 * (os.cpu_count() or 1)


def set_threads(threads: int | None, default: int | None = None) -> None:
    """``--threads``: at least 1 and at most :func:`most_threads` when given (else ``default``, else
    every core); ten million threads crashed the process (a segmentation fault in OpenMP)."""
    if threads is not None and not 1 <= threads <= most_threads():
        raise QkovError(f"--threads must lie in [1, {most_threads()}] on this machine, got {threads}")
    torch.set_num_threads(threads or default or os.cpu_count() or 1)


def checked_checkpoint(path: str) -> Path:
    """A checkpoint folder's config checked before its weights are read: the sizes it implies
    (:func:`qkov.sizes.check_model_size`) and a ``tokenizer.json`` that is a link to nowhere (a
    loop, or a missing file), which would otherwise be silently taken for none. A Hugging Face name
    that is no existing path is its folder in the local cache (:func:`qkov.interop.resolve_source`)."""
    from qkov.checkpoint import TOKENIZER_FILE, load_config
    from qkov.interop import resolve_source
    from qkov.sizes import check_model_size

    folder = resolve_source(path)
    foreign = folder.is_dir() and _is_foreign(folder)  # a Hugging Face or TransformerLens folder
    cfg = load_config(folder) if folder.is_dir() and not foreign else None
    if cfg is not None:
        check_model_size(cfg, str(folder / "config.json"))
    tokenizer = folder / TOKENIZER_FILE
    if tokenizer.is_symlink() and not tokenizer.exists():
        raise QkovError(f"{tokenizer}: a link that leads to no file (a loop, or its target is missing)")
    return folder


def _is_foreign(folder: Path) -> bool:
    """Whether a folder's config is another library's (imported in memory, its sizes checked as
    its tensors are built), not a qkov checkpoint's."""
    from qkov.io import read_json

    file = folder / "config.json"
    data = read_json(file) if file.is_file() else None
    return isinstance(data, dict) and "positional_embedding" not in data and bool(data)


def checked_weights(model: torch.nn.Module, source: str) -> torch.nn.Module:
    """``model``, once no weight is so large that the analyses' products would overflow."""
    from qkov.sizes import check_weight_magnitudes

    check_weight_magnitudes(dict(model.named_parameters()), str(source))
    return model


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        parents=[common_options(f"where to train: {DEVICES}")],
        help="train an attention-only transformer on a corpus",
        description="Train an attention-only transformer. Unset options take the "
        "measured defaults for the depth (see the README).",
    )
    p.add_argument("--layers", type=int, required=True, help="number of attention layers (0, 1, 2, ...)")
    p.add_argument("--out", required=True, help="checkpoint folder to write")
    p.add_argument("--preset", choices=PRESETS, default="default", help="paper: the paper's model sizes")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch size (sequences), whatever --nproc")
    p.add_argument("--lr", type=float)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--d-head", type=int)
    p.add_argument("--n-ctx", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--positional-embedding", choices=POSITIONAL_EMBEDDINGS)
    p.add_argument("--normalization", choices=NORMALIZATIONS, help="LayerNorm (default: none)")
    p.add_argument("--d-mlp", type=int, help="MLP width after each attention layer (default 0: none)")
    p.add_argument("--act-fn", choices=ACT_FNS, help="the MLP's activation (default: gelu_new)")
    add_corpus_argument(
        p,
        "text, .jsonl(.gz/.zst) or .parquet files, folders or globs (repeatable); "
        "default: the Python standard library",
    )
    add_text_field_argument(p)
    p.add_argument("--embed-lr-mult", type=float, help="learning-rate multiplier for W_E and W_pos")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="bf16 autocasts matmuls to bfloat16 (default on GPUs with bf16)",
    )
    p.add_argument("--nproc", type=int, default=1, help="processes on this machine (launches torchrun)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per process and step")
    p.add_argument(
        "--schedule", choices=["cosine", "constant"], help="after warm-up: cosine decay or a constant rate"
    )
    p.add_argument("--eval-every", type=int, help="steps between evenly spaced evaluations (metrics.jsonl)")
    p.add_argument(
        "--evals-per-decade", type=int, help="log-spaced evaluations per decade of steps (0: none)"
    )
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--compile", action="store_true", help="torch.compile the training step (measure first)")


def train_command(args: argparse.Namespace) -> None:
    from qkov.io import check_writable_folder
    from qkov.training_run import TRAIN_FLAGS, TrainingInterrupted, TrainingRun, default_threads, train

    check_writable_folder(args.out)
    set_threads(args.threads, default_threads(args.nproc))
    settings = {name: getattr(args, name) for name in TRAIN_FLAGS}
    run = TrainingRun(
        Path(args.out), args.layers, args.preset, settings, args.corpus, args.text_field, args.device,
        args.resume, args.grad_accum, args.compile, args.nproc, tuple(args.argv),
    )  # fmt: skip
    try:
        train(run, show_progress=not args.quiet)
    except TrainingInterrupted as stop:
        if stop.report:
            console.print(f"interrupted at step {stop.step}; checkpoint saved. Continue with --resume.")
        sys.exit(130)


def info_command(args: argparse.Namespace) -> None:
    from qkov.interop import open_model as load
    from qkov.training_log import read_training_log, row_fields

    folder = checked_checkpoint(args.checkpoint)
    model = load(folder)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.checkpoint}: {n_params:,} parameters ({model.W_E.dtype}), biases: {model.has_biases}")
    for key, value in model.cfg.to_dict().items():
        print(f"  {key}: {value}")
    size = model.tokenizer.get_vocab_size() if model.tokenizer is not None else None
    print(f"  tokenizer: {f'{size} tokens' if size else 'none'}")
    log = read_training_log(folder)
    if log:
        print("  last metrics: " + ", ".join(f"{k} {v}" for k, v in row_fields(log[-1]).items()))


def schema_command(args: argparse.Namespace) -> None:
    from qkov.results import schema_text

    sys.stdout.write(schema_text())


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
        help="run only the steps that read the weights alone: no forward pass, no tokens",
    )
    p.add_argument(
        "--steps",
        metavar="A,B,...",
        type=step_names,
        help="run only these steps (and the steps whose results they read, said in the output); "
        "results.json and the report say which ran",
    )


def step_names(text: str) -> list[str]:
    """``--steps a,b,c``: the names, in order, without blanks or repeats."""
    return list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def default_analysis_folder(source: str, folder: Path) -> Path:
    """Where ``qkov analyze`` writes without ``--out``: ``CHECKPOINT/analysis``, except for a model
    from the Hugging Face cache (never written into): ``analysis/org--name[@revision]`` here."""
    from qkov.interop.hub_cache import hub_name

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
    from qkov.analyze import analyze, check_selection
    from qkov.data.shards import corpus_tokens
    from qkov.data.user_tokens import given_user_tokens
    from qkov.interop import open_model as load
    from qkov.io import atomic_write_text, check_writable_folder
    from qkov.machine import compute_device
    from qkov.report import render_report
    from qkov.results import write_results
    from qkov.training_log import read_training_log

    check_selection(args.steps, args.weights_only, bool(args.corpus), args.tokens is not None)
    set_threads(args.threads)
    folder = checked_checkpoint(args.checkpoint)
    out = check_writable_folder(args.out if args.out else default_analysis_folder(args.checkpoint, folder))
    model = checked_weights(load(folder), args.checkpoint).to(compute_device(args.device))
    corpus = None
    if args.corpus:
        if model.tokenizer is None:
            raise QkovError("--corpus needs a checkpoint with a tokenizer.json to read text")
        corpus = corpus_tokens(args.corpus, model.tokenizer, args.text_field, not args.quiet)
    user = given_user_tokens(args.tokens, args.targets, model.cfg)
    log = read_training_log(folder)
    results = analyze(model, corpus, log, not args.quiet, args.seed, user, args.steps, args.weights_only)
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    atomic_write_text(out / "report.html", render_report({f"{model.cfg.n_layers}-layer": results}))
    for line in summary_lines(results):
        console.print(line, highlight=False)
    console.print(f"wrote {out / 'results.json'} and {out / 'report.html'}")


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


def add_import_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="import a Hugging Face GPT-2, TransformerLens or any model (by a mapping) as a qkov checkpoint",
        description="Read SRC, a folder or a weights file (model.safetensors, or a pickled .pt/.pth/.bin "
        "state dict, read only through torch.load(weights_only=True): tensors and plain containers, "
        "never code): a Hugging Face GPT-2 or a TransformerLens model (config.json from cfg.to_dict() "
        "or in the legacy keys of Neel Nanda's models) with the config.json beside it, or weights in "
        "any layout with --mapping. Fold its LayerNorm and centre its weights as TransformerLens does, "
        "and write a qkov checkpoint folder.",
    )
    p.add_argument(
        "src",
        help="the folder or weights file to import, or a model's Hugging Face name org/name[@revision] in "
        "the local cache (never downloaded)",
    )
    p.add_argument("--out", required=True, help="the qkov checkpoint folder to write")
    p.add_argument("--no-fold", action="store_true", help="keep LayerNorm as it is and change no weight")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the checkpoint or training run already in --out (its training state, training "
        "config and metrics log are removed, so the folder holds only the imported model)",
    )
    p.add_argument("--config", help="the config.json to use (default: the one beside the weights)")
    p.add_argument(
        "--mapping", help="a JSON file mapping the weights' own keys to qkov's, with the model's config"
    )
    p.add_argument(
        "--check",
        metavar="REF",
        help="a safetensors file of tokens [batch, pos] and the source's logits [batch, pos, d_vocab]: "
        "print the largest log-probability difference; refuse the import above 1e-4 (float32 logits: "
        "1024 units in the last place of their largest log-probability, when that is more)",
    )
    p.add_argument(
        "--bos-token-id",
        type=int,
        metavar="N",
        help="the start token the model's sequences begin with in training (default: the source's, "
        "else none): the repeated-token test and corpus text then begin with it",
    )


#: What a checkpoint folder or a training run holds: ``qkov import --out`` refuses a folder holding
#: any of them unless ``--force``, and then removes those the import does not write.
RUN_FILES = ("config.json", "model.safetensors", "tokenizer.json")
TRAINING_FILES = ("train_config.json", "training_state.safetensors", "metrics.jsonl")


def check_import_folder(out: Path, force: bool) -> None:
    """``--out`` writable, and holding no checkpoint or training run unless ``force``."""
    from qkov.io import check_writable_folder

    check_writable_folder(out)
    held = [name for name in RUN_FILES + TRAINING_FILES if (out / name).exists()]
    if held and not force:
        raise QkovError(
            f"{out} already holds a checkpoint or training run ({held[0]}); choose another --out, or "
            "pass --force to replace it"
        )


def import_command(args: argparse.Namespace) -> None:
    from qkov.interop import import_checkpoint

    out = Path(args.out)
    check_import_folder(out, args.force)
    model, lines = import_checkpoint(
        args.src, args.out, not args.no_fold, args.config, args.mapping, args.check, args.bos_token_id
    )
    if args.force:  # the imported model replaced the run's: its state and log no longer describe it
        for name in TRAINING_FILES + (() if model.tokenizer is not None else ("tokenizer.json",)):
            (out / name).unlink(missing_ok=True)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    cfg = model.cfg
    mlp = f"MLP d_mlp {cfg.d_mlp} ({cfg.act_fn})" if cfg.has_mlp else "attention-only"
    console.print(
        f"imported {cfg.n_layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model}, {cfg.d_vocab} tokens, "
        f"{mlp}, normalization {cfg.normalization} (from {cfg.source}) into {args.out}",
        highlight=False,
        markup=False,
        soft_wrap=True,
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


def add_reproduce_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        parents=[common_options(f"where to train and analyse: {DEVICES}")],
        help="train 0/1/2-layer models, analyse them, check the paper's claims, write a report",
        description="Train the 0-, 1- and 2-layer models with the measured defaults (reusing finished "
        "and resuming interrupted runs in DIR), analyse each, and write DIR/results.json and "
        "DIR/report.html.",
    )
    p.add_argument("--out", default="runs/reproduce", help="output folder (default: runs/reproduce)")
    add_corpus_argument(p, "text files, folders or globs (repeatable); default: the Python standard library")
    p.add_argument("--quick", action="store_true", help="tiny models, few steps: exercises every code path")


def reproduce_command(args: argparse.Namespace) -> None:
    from qkov.claims import summary_table
    from qkov.io import check_writable_folder
    from qkov.reproduce import reproduce

    set_threads(args.threads)
    out = check_writable_folder(args.out)
    try:
        results = reproduce(out, args.corpus, args.quick, args.seed, not args.quiet, args.device)
    except KeyboardInterrupt:
        console.print("interrupted; the checkpoint is saved. Rerun the same command to resume.")
        sys.exit(130)
    for model_results in results.models.values():
        print("\n".join(summary_lines(model_results)))
    print(summary_table(results.claims))
    minutes = results.total_s / 60
    print(f"total {minutes:.1f} min; wrote {out / 'results.json'} and {out / 'report.html'}")


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="explore a checkpoint's heads, texts and circuits in the browser",
        description="Serve a local web explorer of one checkpoint: type a text to see every head's "
        "attention and the logits' path expansion, pick a head to read its OV and QK circuits over the "
        "whole vocabulary, pick two heads to see how they compose; with --tokens, choose a row of your own "
        "data and see the same against its targets. Computed on demand and cached.",
    )
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--cache-mb", type=int, default=256, help="memory for cached answers, MiB (default: 256)")
    p.add_argument("--workers", type=int, default=2, help="computations run at once (default: 2)")
    add_user_data_arguments(
        p,
        "adds a data view: every row's loss and accuracy; a row's attention patterns, predictions, "
        "loss per position and path expansion against its targets",
    )
    add_threads_argument(p)


def serve_command(args: argparse.Namespace) -> None:
    from qkov.serve import serve

    if not 1 <= args.port <= 65535:
        raise QkovError(f"--port must lie in [1, 65535], got {args.port}")
    if args.cache_mb < 1 or args.workers < 1:
        raise QkovError("--cache-mb and --workers must be at least 1")
    set_threads(args.threads)
    checked_checkpoint(args.checkpoint)  # a Hugging Face name stays the name the explorer shows
    serve(
        args.checkpoint,
        args.host,
        args.port,
        args.cache_mb,
        args.workers,
        args.tokens,
        args.targets,
    )


def main(argv: list[str] | None = None) -> None:
    from qkov import __version__

    parser = Parser(prog="qkov", description="Transformer circuits, read off the weights.")
    parser.add_argument("--version", action="version", version=f"qkov {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_analyze_parser(sub)
    add_reproduce_parser(sub)
    add_serve_parser(sub)
    add_import_parser(sub)
    add_series_parser(sub)
    info = sub.add_parser("info", help="validate a checkpoint folder and describe it")
    info.add_argument("checkpoint", help=CHECKPOINT_HELP)
    sub.add_parser("schema", help="print the JSON Schema of results.json")
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is shown escaped, not a traceback
        if callable(getattr(stream, "reconfigure", None)):
            stream.reconfigure(errors="backslashreplace")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        {
            "train": train_command,
            "info": info_command,
            "schema": schema_command,
            "analyze": analyze_command,
            "reproduce": reproduce_command,
            "serve": serve_command,
            "import": import_command,
            "series": series_command,
        }[args.command](args)
    except QkovError as err:
        print(f"qkov: error: {one_line(str(err))}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
