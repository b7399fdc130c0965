"""The ``qkov`` command: thin argument parsing around the library.

Every :class:`QkovError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from rich.console import Console

from qkov.checkpoint import load_config, load_tokenizer
from qkov.config import ACT_FNS, NORMALIZATIONS, POSITIONAL_EMBEDDINGS, Config
from qkov.errors import QkovError
from qkov.recipes import PRESETS, recipe
from qkov.results import Results

console = Console(stderr=True)


def add_corpus_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--corpus", action="append", metavar="PATH", help=help)


def common_options(device_help: str) -> argparse.ArgumentParser:
    """The options every long-running command shares: ``--seed``, ``--threads``, ``--quiet`` and
    ``--device`` (its help says what the command computes there)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores; for train, per process)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--device", default="cpu", help=device_help)
    return p


DEVICES = "cpu (default), cuda, cuda:1, ..."


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
    p.add_argument("--text-field", default="text", help="the text's field in .jsonl and column in .parquet")
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
    from qkov.distributed import launched_by_torchrun, process_group
    from qkov.machine import compute_device
    from qkov.train import Trainer

    if args.nproc < 1:
        raise QkovError(f"--nproc must be at least 1, got {args.nproc}")
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", args.nproc))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_processes))
    if args.nproc > 1 and not launched_by_torchrun():
        prepare_run(args)  # errors found here, once; the workers read the cached tokens
        launch_workers(args)
        return
    device = compute_device(args.device)
    with process_group(device) as processes:
        if not processes.is_main:  # the cache is filled by rank 0 first, read by the others
            processes.barrier()
        cfg, train_cfg, data, tokenizer, corpus = prepare_run(args, show_progress=processes.is_main)
        if processes.is_main:
            processes.barrier()
        trainer = Trainer(
            cfg, train_cfg, data, args.out, tokenizer, args.device, args.grad_accum, compile=args.compile
        )
        say = console.print if processes.is_main else lambda *a: None
        say(
            f"corpus: {len(corpus.files)} file(s), {len(data.train):,} train / {len(data.eval):,} eval "
            f"tokens; vocabulary {cfg.d_vocab}"
        )
        say(f"model: {cfg}")
        say(
            f"training: {train_cfg.steps} steps x {train_cfg.batch_size} x {cfg.n_ctx} tokens, "
            f"lr {train_cfg.lr}, {train_cfg.precision}, {processes.world_size} process(es) x "
            f"{args.grad_accum} micro-batch(es) x {torch.get_num_threads()} threads"
        )
        try:
            trainer.run(resume=args.resume, show_progress=not args.quiet)
        except KeyboardInterrupt:
            say(f"interrupted at step {trainer.step}; checkpoint saved. Continue with --resume.")
            sys.exit(130)
        say(f"done: checkpoint in {args.out} (metrics in {Path(args.out) / 'metrics.jsonl'})")


def prepare_run(args: argparse.Namespace, show_progress: bool = True):
    """The configs (the saved ones on --resume, else the recipe with the flags on top), the
    tokenizer and the sharded tokens of a ``qkov train`` command, and the corpus' files."""
    from qkov.data.shards import sampled_tokenizer, sharded_tokens
    from qkov.data.sources import CorpusFiles
    from qkov.train import TRAIN_CONFIG_FILE, TrainConfig

    out = Path(args.out)
    corpus = CorpusFiles.find(args.corpus, args.text_field)
    if args.resume and (out / TRAIN_CONFIG_FILE).exists():
        tokenizer = load_tokenizer(out)
        cfg = load_config(out)
        train_cfg = TrainConfig(**json.loads((out / TRAIN_CONFIG_FILE).read_text()))
        check_resume_flags(args, cfg, train_cfg)
        if tokenizer is None:
            raise QkovError(f"{out}: the run to resume has no tokenizer.json")
    else:
        flags = {name: getattr(args, name) for name in TRAIN_FLAGS} | {"n_layers": args.layers}
        if args.device != "cpu" and args.precision is None and torch.cuda.is_available():
            flags["precision"] = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        r = recipe(args.layers, args.preset).override(**flags)
        tokenizer = sampled_tokenizer(corpus, r.vocab_size)
        cfg, train_cfg = r.configs(tokenizer.get_vocab_size())
    data = sharded_tokens(corpus, tokenizer, show_progress and not args.quiet)
    return cfg, train_cfg, data, tokenizer, corpus


#: ``qkov train`` flags that override a recipe's setting of the same name.
TRAIN_FLAGS = (
    "steps", "batch_size", "lr", "d_model", "n_heads", "d_head", "n_ctx", "vocab_size",
    "positional_embedding", "normalization", "d_mlp", "act_fn", "seed", "embed_lr_mult", "precision",
    "schedule", "eval_every", "evals_per_decade", "checkpoint_every",
)  # fmt: skip


def launch_workers(args: argparse.Namespace) -> None:
    """Run this command in ``--nproc`` processes under torchrun and wait for them. Ctrl-C reaches
    every worker (they share the terminal's process group); each stops after rank 0's checkpoint."""
    import subprocess

    from qkov.distributed import torchrun_command
    from qkov.train import STATE_FILE

    interrupted = False
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}  # torchrun's own default is 1
    worker = subprocess.Popen(torchrun_command(args.nproc, args.argv), env=os.environ | threads)
    while worker.poll() is None:
        try:
            worker.wait()
        except KeyboardInterrupt:
            interrupted = True
    if interrupted or worker.returncode == 130:
        step = saved_step(Path(args.out) / STATE_FILE)
        console.print(f"interrupted at step {step}; checkpoint saved. Continue with --resume.")
        sys.exit(130)
    if worker.returncode:
        raise QkovError(f"training processes failed (torchrun exit status {worker.returncode}); see above")


def saved_step(file: Path) -> str:
    from safetensors import safe_open

    if not file.exists():
        return "0"
    with safe_open(str(file), framework="pt") as f:
        return f.metadata()["step"]


def check_resume_flags(args: argparse.Namespace, cfg: Config, train_cfg: object) -> None:
    """On --resume the saved settings rule; an explicit flag that contradicts them is an error."""
    saved = cfg.to_dict() | dataclasses.asdict(train_cfg)
    for flag, key in (
        ("layers", "n_layers"),
        ("d_model", "d_model"),
        ("n_heads", "n_heads"),
        ("d_head", "d_head"),
        ("n_ctx", "n_ctx"),
        ("steps", "steps"),
        ("batch_size", "batch_size"),
        ("lr", "lr"),
        ("precision", "precision"),
        ("normalization", "normalization"),
        ("d_mlp", "d_mlp"),
        ("act_fn", "act_fn"),
    ):
        given = getattr(args, flag)
        if given is not None and given != saved[key]:
            raise QkovError(
                f"--{flag.replace('_', '-')} {given} contradicts the run being resumed ({saved[key]})"
            )


def info_command(args: argparse.Namespace) -> None:
    from qkov.checkpoint import load

    model = load(args.checkpoint)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.checkpoint}: {n_params:,} parameters ({model.W_E.dtype}), biases: {model.has_biases}")
    for key, value in model.cfg.to_dict().items():
        print(f"  {key}: {value}")
    size = model.tokenizer.get_vocab_size() if model.tokenizer is not None else None
    print(f"  tokenizer: {f'{size} tokens' if size else 'none'}")
    metrics = Path(args.checkpoint) / "metrics.jsonl"
    if metrics.exists() and metrics.read_text().strip():
        last = json.loads(metrics.read_text().splitlines()[-1])
        print("  last metrics: " + ", ".join(f"{k} {v}" for k, v in last.items()))


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
    p.add_argument("checkpoint", help="checkpoint folder (config.json, model.safetensors, [tokenizer.json])")
    p.add_argument("--out", help="output folder (default: CHECKPOINT/analysis)")
    add_corpus_argument(
        p,
        "text files, folders or globs (repeatable), or 'stdlib' for the embedded default corpus: "
        "adds the bigram comparison and checks skip-trigram bugs against the text",
    )


def analyze_command(args: argparse.Namespace) -> None:
    from qkov.analyze import analyze
    from qkov.checkpoint import load
    from qkov.circuits.phase_change import read_training_log
    from qkov.data.corpus import read_corpus
    from qkov.data.tokens import cached_tokens
    from qkov.io import atomic_write_text
    from qkov.machine import compute_device
    from qkov.report import render_report
    from qkov.results import write_results

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    out = Path(args.out) if args.out else Path(args.checkpoint) / "analysis"
    model = load(args.checkpoint).to(compute_device(args.device))
    corpus = None
    if args.corpus:
        if model.tokenizer is None:
            raise QkovError("--corpus needs a checkpoint with a tokenizer.json to read text")
        corpus = cached_tokens(
            read_corpus(None if args.corpus == ["stdlib"] else args.corpus), model.tokenizer
        )
    log = read_training_log(Path(args.checkpoint))
    results = analyze(model, corpus, log, not args.quiet, args.seed)
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
    p.add_argument("src", help="the folder or weights file to import")
    p.add_argument("--out", required=True, help="the qkov checkpoint folder to write")
    p.add_argument("--no-fold", action="store_true", help="keep LayerNorm as it is and change no weight")
    p.add_argument("--config", help="the config.json to use (default: the one beside the weights)")
    p.add_argument(
        "--mapping", help="a JSON file mapping the weights' own keys to qkov's, with the model's config"
    )
    p.add_argument(
        "--check",
        metavar="REF",
        help="a safetensors file of tokens [batch, pos] and the source's logits [batch, pos, d_vocab]: "
        "print the largest log-probability difference; refuse the import above 1e-4",
    )


def import_command(args: argparse.Namespace) -> None:
    from qkov.interop import import_checkpoint

    model, lines = import_checkpoint(
        args.src, args.out, not args.no_fold, args.config, args.mapping, args.check
    )
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
    from qkov.reproduce import reproduce

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    out = Path(args.out)
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
        "whole vocabulary, pick two heads to see how they compose. Computed on demand and cached.",
    )
    p.add_argument("checkpoint", help="checkpoint folder (config.json, model.safetensors, [tokenizer.json])")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--cache-mb", type=int, default=256, help="memory for cached answers, MiB (default: 256)")
    p.add_argument("--workers", type=int, default=2, help="computations run at once (default: 2)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads (default: all cores)")


def serve_command(args: argparse.Namespace) -> None:
    from qkov.serve import serve

    if not 1 <= args.port <= 65535:
        raise QkovError(f"--port must lie in [1, 65535], got {args.port}")
    if args.cache_mb < 1 or args.workers < 1:
        raise QkovError("--cache-mb and --workers must be at least 1")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    serve(args.checkpoint, args.host, args.port, args.cache_mb, args.workers)


def main(argv: list[str] | None = None) -> None:
    from qkov import __version__

    parser = argparse.ArgumentParser(prog="qkov", description="Transformer circuits, read off the weights.")
    parser.add_argument("--version", action="version", version=f"qkov {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_analyze_parser(sub)
    add_reproduce_parser(sub)
    add_serve_parser(sub)
    add_import_parser(sub)
    info = sub.add_parser("info", help="validate a checkpoint folder and describe it")
    info.add_argument("checkpoint")
    sub.add_parser("schema", help="print the JSON Schema of results.json")
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
        }[args.command](args)
    except QkovError as err:
        print(f"qkov: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
