"""``qkov analyze`` end to end on a GPT-2-small-shaped model, this code beside the code it started
from (a worktree of main, ``--old``) in one run, each stage timed, beside what the same work costs in
TransformerLens 3.x. A random ``GPT2LMHeadModel`` (12 layers x 12 heads, d_model 768, d_mlp 3072,
50257 tokens, n_ctx 1024; built locally, nothing downloaded) is saved as a Hugging Face folder and
imported with ``qkov import``; then

1. ``qkov analyze DIR`` in a fresh process, the old code's (``PYTHONPATH=OLD/src``) and this one's:
   wall time and peak resident memory (``/usr/bin/time``), and the batches each behavioural step
   used, read from its results.json; the fp32 matmul rate before and after;
2. with ``--stages``: the same steps in this process, one at a time (``analyze.STEPS``, the inputs
   ``analyze`` draws), each step's time, then writing results.json and the report; with ``--flops``
   also each step's matrix-product FLOP, counted by ``torch.utils.flop_counter`` in a second pass
   (from a fresh draw of the same inputs: the counting slows each product, so it is not timed), the
   rate each step reached, and the time the products alone take at the issue's scale, 100 GFLOP/s
   a thread (the scaled time's floor: what no code doing this work can beat);
3. with ``--transformer-lens``: the same work in TransformerLens where it has it, on the same
   inputs: the head scores' cached run, one ablation as a full rerun with a hook (TransformerLens
   has no rerun from a layer; x the number of ablations), and the full OV eigenvalues of one layer
   (x the number of layers), building the circuit included. Estimates from a measured part say
   so. TransformerLens' spectra and composition scores at these shapes are measured in
   ``spectra.py`` and ``composition.py`` (10 and 8.5 GiB at peak; their figures are in the README).

    git worktree add --detach /tmp/old-h15 main
    flock /tmp/qkov-heavy.lock python benchmarks/analyze_gpt2.py --old /tmp/old-h15
    flock /tmp/qkov-heavy.lock python benchmarks/analyze_gpt2.py --old /tmp/old-h15 --abba
    flock /tmp/qkov-heavy.lock python benchmarks/analyze_gpt2.py --stages --flops
                                        # old, new, new, old: a drifting machine favours neither
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import MappingProxyType

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

import qkov
from import_gpt2 import transformer_lens_import
from qkov import analyze as A
from qkov.circuits.ablation import MODES
from qkov.context import Context
from qkov.data.tokenizer import token_strings
from qkov.interop import import_checkpoint
from qkov.machine import matmul_rate
from qkov.report import render_report
from qkov.results import Results, write_results

from peak_memory import measure
from side_by_side import add_arguments, check_arguments, ratio_line, run_order


def build(folder: Path, n_ctx: int, layers: int):
    """A random GPT-2 folder and its qkov import; returns the transformers config."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=layers, n_head=12, n_embd=768, vocab_size=50257, n_positions=n_ctx
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder / "hf", safe_serialization=True)
    import_checkpoint(folder / "hf", folder / "qkov")
    return config


def end_to_end(checkpoint: Path, out: Path, threads: int, src: Path | None = None) -> tuple[float, float]:
    """``qkov analyze`` in a fresh process (the code under ``src`` when given): (wall seconds, peak
    RSS in GB)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "qkov", "analyze", str(checkpoint)]
    command += ["--out", str(out), "--threads", str(threads), "--quiet"]
    env = os.environ | ({"PYTHONPATH": str(src / "src")} if src is not None else {})
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - started
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return wall, peak_kb / 2**20


def used(out: Path) -> str:
    """What the behavioural steps of one results.json read: the budgets' batches, and the ablations
    rerun exactly beside those estimated."""
    r = json.loads((out / "results.json").read_text())
    rep, effects, estimate = r["repeated_tokens"], r["ablation"], r.get("ablation_estimate")
    length = (r["config"]["bos_token_id"] is not None) + rep["repeats"] * rep["period"]
    lines = [f"head scores {rep['sequences']} x {length} tokens (period {rep['period']})"]
    e = effects[0]
    shape = f"{e['sequences']} x {e['start'] + 3 * e['period']} tokens"
    lines.append(f"ablations: {len(effects)} exact reruns on {shape}")
    if estimate is not None:
        rho = estimate["rank_correlation"]
        lines.append(
            f"{len(estimate['ablations'])} estimated ({estimate['method']}), "
            f"{estimate['exact']} of them also "
            f"exact, Spearman rho {'-' if rho is None else f'{rho:.3f}'}"
        )
    lines.append(f"term importance on {r['term_importance']['tokens']}")
    return "; ".join(lines)


def stages(model: qkov.Transformer, out: Path) -> tuple[Context, dict[str, float]]:
    """Every step of ``analyze`` timed alone, then the writing; returns the context (its inputs)
    and each step's seconds."""
    done: dict = {}
    ctx = Context.of(model, None, 0, MappingProxyType(done))
    seconds: dict[str, float] = {}
    with torch.no_grad():
        for step in A.STEPS:
            if step.skip_reason(model.cfg, has_corpus=False) is not None:
                continue
            done[step.name], seconds[step.name], m = measure(lambda step=step: step.run(ctx))
            print(f"  {step.name:24s} {seconds[step.name]:8.2f} s {m / 2**20:8.0f} MiB", flush=True)
    strings = token_strings(model.tokenizer, model.cfg.d_vocab)
    results = Results(config=model.cfg, tokens=strings, training=[], phase_change=None, **done)

    def write():
        out.mkdir(parents=True, exist_ok=True)
        write_results(results, out)
        (out / "report.html").write_text(render_report({"gpt2": results}))

    _, s, m = measure(write)
    print(f"  {'write results + report':24s} {s:8.2f} s {m / 2**20:8.0f} MiB")
    print(f"  {'total (steps + writing)':24s} {sum(seconds.values()) + s:8.2f} s")
    return ctx, seconds


class ProductFlops(TorchDispatchMode):
    """The FLOP of every matrix product run inside it, as ``torch.utils.flop_counter`` counts them
    (its registry). Not ``FlopCounterMode`` itself: its module tracker breaks ``autograd.grad``, which
    the ablation estimate calls."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        counted = flop_registry.get(func._overloadpacket)
        if counted is not None:
            self.total += counted(*args, **kwargs, out_val=out)
        return out


def flops(model: qkov.Transformer, seconds: dict[str, float], threads: int) -> None:
    """Each step's matrix-product FLOP (:class:`ProductFlops`: matmuls, linear layers,
    einsums and attention; not elementwise work, softmax, or LAPACK's eigenvalues), run again from
    a fresh context, which draws the same inputs from the same seed. Beside the time ``stages``
    measured: the rate reached, and the floor, the products alone at 100 GFLOP/s a thread."""
    done: dict = {}
    ctx = Context.of(model, None, 0, MappingProxyType(done))
    floor_rate = threads * 100e9
    total = 0.0
    with torch.no_grad():
        for step in A.STEPS:
            if step.name not in seconds:
                continue
            with ProductFlops() as counter:
                done[step.name] = step.run(ctx)
            count = counter.total
            total += count
            rate = count / seconds[step.name] / 1e9
            print(
                f"  {step.name:24s} {count / 1e12:7.3f} TFLOP  {rate:6.0f} GFLOP/s reached  "
                f"floor {count / floor_rate:6.2f} s",
                flush=True,
            )
    print(
        f"  {'total':24s} {total / 1e12:7.3f} TFLOP  {total / sum(seconds.values()) / 1e9:6.0f} GFLOP/s "
        f"reached  floor {total / floor_rate:6.2f} s: the scaled time of these products alone "
        f"({threads} threads at 100 GFLOP/s each)"
    )


def batches(ctx: Context) -> None:
    print(f"  head scores: {tuple(ctx.repeated.shape)} tokens, period {ctx.period}")
    print(f"  ablations: {tuple(ctx.attribution.tokens.shape)} tokens, period {ctx.attribution.period}")


def transformer_lens(ctx: Context, hf_folder: Path, hf_config) -> None:
    """The same work in TransformerLens where it has it (see the module docstring)."""
    hooked, s, m = measure(lambda: transformer_lens_import(hf_folder, hf_config))
    print(f"  {'load + fold':40s} {s:8.2f} s {m / 2**20:8.0f} MiB")
    cfg = ctx.model.cfg
    with torch.no_grad():
        _, s, m = measure(lambda: hooked.run_with_cache(ctx.repeated))
        stage = f"head scores: run_with_cache {tuple(ctx.repeated.shape)}"
        print(f"  {stage:40s} {s:8.2f} s {m / 2**20:8.0f} MiB")
        tokens = ctx.attribution.tokens

        def zero_head(z, hook):
            z[:, :, 0] = 0.0
            return z

        def one_ablation():
            with hooked.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero_head)]):
                return hooked.run_with_cache(tokens)  # logits for the loss, patterns for the scores

        _, s, m = measure(one_ablation)
        runs = len(MODES) * (cfg.n_layers - 1) * cfg.n_heads
        print(
            f"  {'ablation: 1 full rerun ' + str(tuple(tokens.shape)):40s} {s:8.2f} s {m / 2**20:8.0f} MiB"
            f"   x{runs} = {s * runs:.0f} s (estimate)"
        )
        _, s, m = measure(lambda: (hooked.W_E @ hooked.OV[0] @ hooked.W_U).eigenvalues)
        print(
            f"  {'copying: full-OV eigenvalues, layer 0':40s} {s:8.2f} s {m / 2**20:8.0f} MiB"
            f"   x{cfg.n_layers} = {s * cfg.n_layers:.0f} s (estimate)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-ctx", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    add_arguments(parser)
    parser.add_argument("--stages", action="store_true", help="also time each step in this process")
    parser.add_argument("--transformer-lens", action="store_true", help="also time TransformerLens")
    parser.add_argument(
        "--flops", action="store_true", help="with --stages: also count each step's matrix-product FLOP"
    )
    args = parser.parse_args()
    check_arguments(parser, args)
    if args.flops and not args.stages:
        parser.error("--flops counts the steps that --stages runs: give both")
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        hf_config = build(folder, args.n_ctx, args.layers)
        print(
            f"random GPT-2: {args.layers} layers x 12 heads, d_model 768, d_mlp 3072, 50257 tokens, "
            f"n_ctx {args.n_ctx}; {args.threads} threads, torch {torch.__version__}"
        )
        print(f"fp32 matmul rate before: {matmul_rate() / 1e9:.0f} GFLOP/s, load {os.getloadavg()[0]:.1f}")
        runs = run_order(args.old, None, args.abba) if args.old else [("new", None)]
        walls: dict[str, list[float]] = {"old": [], "new": []}
        for index, (name, src) in enumerate(runs):
            out = folder / f"out-{index}-{name}"
            wall, peak = end_to_end(folder / "qkov", out, args.threads, src)
            walls[name].append(wall)
            load = os.getloadavg()[0]
            figures = f"{wall:.1f} s wall, {peak:.2f} GB peak RSS (load {load:.1f})"
            print(f"qkov analyze end to end, {name}: {figures}")
            print(f"  {used(out)}")
        if args.old:
            print(ratio_line(walls))
        print(f"fp32 matmul rate after: {matmul_rate() / 1e9:.0f} GFLOP/s, load {os.getloadavg()[0]:.1f}")
        if args.stages or args.transformer_lens:
            print("qkov analyze, step by step:")
            model = qkov.load(folder / "qkov").eval()
            ctx, seconds = stages(model, folder / "steps")
            batches(ctx)
            if args.flops:
                print("matrix products by step (counted in a second pass, not timed):")
                flops(model, seconds, args.threads)
        if args.transformer_lens:
            print("TransformerLens, the same work where it has it:")
            transformer_lens(ctx, folder / "hf", hf_config)


if __name__ == "__main__":
    main()
