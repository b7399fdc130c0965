"""Importing and analysing a GPT-2-small-shaped model: qkov against TransformerLens 3.x, side by
side in one run. A random ``GPT2LMHeadModel`` (12 layers x 12 heads, d_model 768, d_mlp 3072,
50257 tokens; built locally, nothing downloaded) is saved as a Hugging Face folder, then

1. *import + fold*: ``qkov import`` (read, convert, fold, save a checkpoint) against what
   TransformerLens does for the same folder (``GPT2LMHeadModel.from_pretrained``,
   ``convert_gpt2_weights``, ``load_and_process_state_dict`` with every fold), time and peak
   extra memory;
2. *the stages of* ``qkov analyze``, each timed alone on the imported model, with the same work in
   TransformerLens where it has it (copying eigenvalues, repeated-token head scores, composition).
   The stages that would take many minutes are timed on a part and scaled, and say so.
   TransformerLens' composition scores at these shapes are in ``composition.py`` (9 GB at peak).

    flock /tmp/qkov-heavy.lock python benchmarks/import_gpt2.py            # about 10 minutes, ~6 GB
    flock /tmp/qkov-heavy.lock python benchmarks/import_gpt2.py --layers 2 # a quicker look

``--n-ctx`` (default 128) is the context: ``qkov analyze`` scores heads on a batch of 32
sequences of ``n_ctx`` tokens, whose cached patterns and head writes grow as ``n_ctx^2`` and
``n_ctx`` (printed below), so GPT-2's own 1024 does not fit this machine.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path

import torch

import qkov
from qkov.checkpoint import model_from_tensors
from qkov.circuits.ablation import run_ablated
from qkov.circuits.composition import (
    all_raw_composition_scores,
    composition_baseline,
    k_composition_positivity,
)
from qkov.circuits.copying import copying_analysis, random_copying_scores
from qkov.circuits.heads import (
    duplicate_token_scores,
    induction_scores,
    previous_token_scores,
)
from qkov.circuits.paths import term_importance
from qkov.circuits.qk_ov import full_ov_circuit, qk_term_rms
from qkov.context import REPEAT_BATCH, REPEATS
from qkov.data.random_tokens import repeated_random_tokens
from qkov.interop import import_checkpoint

from peak_memory import measure


def row(
    stage: str, qkov_s: float, qkov_mem: int, tl_s: float | None = None, tl_mem: int | None = None
) -> None:
    theirs = "" if tl_s is None else f"{tl_s:9.2f} s {tl_mem / 2**20:8.0f} MiB   {tl_s / qkov_s:5.2f}x"
    print(f"{stage:44s} {qkov_s:9.2f} s {qkov_mem / 2**20:8.0f} MiB   {theirs}", flush=True)


def transformer_lens_import(folder: Path, hf_config):
    """What TransformerLens does with a local GPT-2 folder: load it with transformers, convert the
    weights, build the HookedTransformer and fold as ``from_pretrained`` does."""
    import transformer_lens as tl
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder)
    cfg = tl.HookedTransformerConfig(
        n_layers=hf_config.n_layer,
        d_model=hf_config.n_embd,
        n_heads=hf_config.n_head,
        d_head=hf_config.n_embd // hf_config.n_head,
        d_mlp=4 * hf_config.n_embd,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        device="cpu",
    )
    state = convert_gpt2_weights(hf, cfg)
    del hf
    hooked = tl.HookedTransformer(cfg)
    hooked.load_and_process_state_dict(
        state, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )
    return hooked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--n-ctx", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--skip", default="", help="comma-separated stages of analyze to leave out, of: " + STAGES
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=args.layers, n_head=12, n_embd=768, vocab_size=50257, n_positions=args.n_ctx
    )
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "gpt2", Path(tmp) / "qkov"
        transformers.GPT2LMHeadModel(config).save_pretrained(src, safe_serialization=True)
        size = (src / "model.safetensors").stat().st_size
        print(
            f"random GPT-2: {args.layers} layers x 12 heads, d_model 768, d_mlp 3072, 50257 tokens, "
            f"n_ctx {args.n_ctx}; {size / 2**20:.0f} MiB of float32; {args.threads} threads, "
            f"torch {torch.__version__}"
        )
        print(f"{'stage':44s} {'qkov':>11s} {'peak':>12s}   {'TransformerLens':>11s} {'peak':>12s}   ratio")
        (model, _), import_s, import_mem = measure(lambda: import_checkpoint(src, out))
        hooked, tl_s, tl_mem = measure(lambda: transformer_lens_import(src, config))
        row("import + fold (+ save, qkov)", import_s, import_mem, tl_s, tl_mem)
        ours, theirs = qkov.interop.to_transformer_lens(model), hooked.state_dict()
        diff = max(float((ours[name] - theirs[name]).abs().max()) for name in ours)
        print(f"  folded weights, qkov vs TransformerLens: max abs difference {diff:.2e}")
        _, load_s, load_mem = measure(lambda: qkov.load(out))
        row("qkov.load of the imported checkpoint", load_s, load_mem)
        analyze_stages(model.eval(), hooked, set(args.skip.split(",")))


def analyze_stages(model: qkov.Transformer, hooked, skip: set[str]) -> None:
    """Each stage of ``qkov analyze`` for a model of 2+ layers, timed alone (no_grad, as analyze),
    but those named in ``skip`` (see ``STAGES``)."""
    cfg = model.cfg
    generator = torch.Generator().manual_seed(0)
    period = cfg.n_ctx // REPEATS
    repeated = repeated_random_tokens(REPEAT_BATCH, period, REPEATS, cfg.d_vocab, generator)
    with torch.no_grad():
        if "eigenvalues" not in skip:
            _, s, m = measure(lambda: full_ov_circuit(model).to(torch.float64).eigenvalues())
            _, ts, tm = measure(lambda: (hooked.W_E @ hooked.OV @ hooked.W_U).eigenvalues)
            row("copying: full-OV eigenvalues, all heads", s, m, ts, tm)
        if "baseline" not in skip:
            full = full_ov_circuit(model)[0, 0].to(torch.float64)
            _, s, m = measure(lambda: random_copying_scores(full, 200, torch.Generator().manual_seed(0)))
            row("copying: random baseline (200 draws)", s, m)
        if "copying-step" not in skip:
            copying_step(model)
        if "head-scores" not in skip:
            head_scores(model, hooked, repeated, period)
        if "qk-terms" not in skip:
            _, s, m = measure(lambda: qk_term_rms(model))
            row("position versus content (QK terms)", s, m)
        if "term-importance" not in skip:
            _, s, m = measure(lambda: term_importance(model, repeated))
            row("term importance (repeated tokens)", s, m)
        if "composition" not in skip:

            def composition():
                baseline = composition_baseline(cfg.d_model, cfg.d_head)
                return {kind: raw - baseline for kind, raw in all_raw_composition_scores(model).items()}

            _, s, m = measure(composition)
            row("composition Q, K, V, every pair, baseline", s, m)  # TransformerLens: composition.py
        if "induction-check" not in skip:
            _, s, m = measure(lambda: k_composition_positivity(model))
            row("induction check (K-composition positivity)", s, m)
        if "ablation" not in skip:
            _, clean = model.run_with_cache(repeated)
            _, s, m = measure(lambda: run_ablated(model, repeated, 0, 0, "mean", clean_cache=clean))
            runs = 2 * (cfg.n_layers - 1) * cfg.n_heads
            row(f"ablation: 1 run (x{runs} = the whole step)", s, m)


STAGES = (
    "eigenvalues, baseline, copying-step, head-scores, qk-terms, term-importance, composition, "
    "induction-check, ablation"
)


def head_scores(model: qkov.Transformer, hooked, repeated: torch.Tensor, period: int) -> None:
    """Previous-token, induction and duplicate-token scores from one cached run, in both libraries."""

    def behaviour():
        _, cache = model.run_with_cache(repeated)
        return (
            previous_token_scores(cache),
            induction_scores(cache, period),
            duplicate_token_scores(cache, period),
        )

    def tl_behaviour():
        _, cache = hooked.run_with_cache(repeated)
        return cache

    _, s, m = measure(behaviour)
    _, ts, tm = measure(tl_behaviour)
    row(f"head scores: run_with_cache {REPEAT_BATCH} x {repeated.shape[1]} tokens", s, m, ts, tm)


def copying_step(model: qkov.Transformer) -> None:
    """analyze's whole copying step (eigenvalues, baseline, the full-vocabulary direct measures) on
    the first layer alone: its cost is the same for every layer."""
    cfg = model.cfg
    state = model.state_dict()
    layer0 = {k: v for k, v in state.items() if not k.startswith("blocks.") or k.startswith("blocks.0.")}
    one_layer = model_from_tensors(qkov.Config(**(cfg.to_dict() | {"n_layers": 1})), layer0, "layer 0")
    _, s, m = measure(lambda: copying_analysis(one_layer))
    row(f"copying: whole step, 1 layer (x{cfg.n_layers} = all)", s, m)


if __name__ == "__main__":
    main()
