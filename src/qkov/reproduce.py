"""The paper end to end: train 0-, 1- and 2-layer attention-only models on a corpus, analyse each,
and check the paper's claims against the measurements (``qkov reproduce``).

Each model trains into ``DIR/{n}-layer``; a finished one is reused and an interrupted one resumed
when the command is rerun. ``DIR/results.json`` holds every model's analysis (``models``) and the
``claims`` (:mod:`qkov.claims`: whether one ``holds`` is computed from the measurement by its rule,
never by hand); ``DIR/report.html`` shows them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from qkov.analyze import analyze
from qkov.circuits.phase_change import phase_change
from qkov.claims import evaluate_claims
from qkov.data.shards import corpus_tokens
from qkov.io import atomic_write_text
from qkov.machine import compute_device, matmul_rate, training_seconds
from qkov.recipes import Recipe, recipe
from qkov.report import render_report
from qkov.results import ModelTiming, Reproduction, write_results
from qkov.training_log import read_training_log
from qkov.training_run import TrainingRun, settings_of, train

DEPTHS = (0, 1, 2)
console = Console(stderr=True)


def quick_recipe(n_layers: int) -> Recipe:
    """Tiny models and few steps: every code path in under 3 minutes, no phenomena promised."""
    return recipe(n_layers).override(
        d_model=32, n_heads=2, d_head=16, n_ctx=48, vocab_size=512, steps=150, batch_size=8, eval_every=50,
        checkpoint_every=50,
    )  # fmt: skip


def announce_estimate(recipes: list[Recipe], device: str) -> None:
    """The machine's fp32 matmul rate and the whole run's time it implies (:mod:`qkov.machine`)."""
    if device != "cpu":
        return
    rate = matmul_rate()
    seconds = sum(training_seconds(r.model, r.train.steps, r.train.batch_size, rate) for r in recipes)
    console.print(
        f"machine: fp32 matmul rate {rate / 1e9:.0f} GFLOP/s with {torch.get_num_threads()} thread(s); "
        f"estimate for the whole run {seconds / 60:.0f} min (README: the time depends on this rate)"
    )


def reproduce(
    out: Path,
    corpus: list[str] | None = None,
    quick: bool = False,
    seed: int = 0,
    show_progress: bool = True,
    device: str = "cpu",
) -> Reproduction:
    started = time.perf_counter()
    compute_device(device)  # before any work: an unusable device is one line
    recipes = [quick_recipe(n) if quick else recipe(n) for n in DEPTHS]
    announce_estimate(recipes, device)
    models, timings = {}, {}
    for n_layers, r in zip(DEPTHS, recipes, strict=True):
        folder = out / f"{n_layers}-layer"
        shape = f"{r.train.steps} steps x {r.train.batch_size} x {r.model.n_ctx} tokens"
        console.print(f"[bold]{n_layers}-layer model[/bold]: {shape} -> {folder}")
        t0 = time.perf_counter()
        # every setting given: a folder trained with other settings is an error, not resumed
        run = TrainingRun(folder, n_layers, settings=settings_of(r.override(seed=seed)), corpus=corpus,
                          device=device, resume=True)  # fmt: skip
        model = train(run, show_progress)  # on the device: analysed there
        t1 = time.perf_counter()
        data = corpus_tokens(corpus, model.tokenizer)  # the tokens it trained on, from the cache
        log = read_training_log(folder)
        models[f"{n_layers}-layer"] = analyze(model, data, log, show_progress, seed)
        timings[f"{n_layers}-layer"] = ModelTiming(round(t1 - t0, 1), round(time.perf_counter() - t1, 1))
    one, two = models["1-layer"], models["2-layer"]  # the phase change, with the 1-layer control
    models["2-layer"] = replace(two, phase_change=phase_change(two.training, one.training))
    results = Reproduction(
        models=models,
        claims=evaluate_claims(models, quick=quick),
        timings=timings,
        total_s=round(time.perf_counter() - started, 1),
        quick=quick,
        device=device,
        corpus=corpus or "Python standard library (embedded default)",
    )
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    title = "qkov: A Mathematical Framework for Transformer Circuits, reproduced" + (
        " (--quick)" if quick else ""
    )
    atomic_write_text(out / "report.html", render_report(models, results.claims, title))
    return results
