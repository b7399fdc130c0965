"""The architectures table of docs/architectures.md: every Hugging Face family qkov reads, built tiny
and random by ``transformers`` from its own Config class (no download), saved in bfloat16 and sharded
as ``save_pretrained`` writes them, then read by qkov as a user would (``qkov analyze FOLDER``).

For each family: does it import; qkov's float64 log-probabilities and attention patterns against
``transformers``' own float64 forward (the float32 weights, before the bfloat16 save); ``qkov
analyze`` on the bfloat16 folder: the steps that ran, those skipped and why, and the time.

    python studies/families.py [--out runs/families] [--only llama,gemma2] [--transformer-lens]

Prints a Markdown table; seeds fixed (weights: seed 0, tokens: seed 1). With ``--transformer-lens``,
one row per TransformerLens option instead (the cases of tests/test_tl_options.py): a qkov model
with the option exported to TransformerLens 3's HookedTransformer (the oracle), compared in float64,
saved by TransformerLens and analysed from that folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from families import SEQ, family_configs, oracle, random_hf_model  # noqa: E402
from qkov.interop import from_hf, save_transformer_lens, to_hooked_transformer  # noqa: E402
from test_tl_options import CASES, random_model  # noqa: E402


def agreement(name: str, config, folder: Path) -> tuple[float, float]:
    """Largest log-probability and attention-pattern differences against transformers (float64)."""
    model = random_hf_model(config)
    tokens = torch.randint(0, config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    log_probs, patterns = oracle(model, tokens)
    model.save_pretrained(folder / "f64")
    ours = from_hf(folder / "f64").double().requires_grad_(False)
    logits, cache = ours.run_with_cache(tokens)
    lp = float((logits.log_softmax(-1) - log_probs).abs().max())
    pat = max(float((cache[f"blocks.{i}.attn.hook_pattern"] - p).abs().max()) for i, p in enumerate(patterns))
    model.to(torch.bfloat16).save_pretrained(folder / "bf16", max_shard_size="10KB")
    return lp, pat


def tl_agreement(options: dict, folder: Path) -> tuple[float, float]:
    """A qkov model with ``options`` against TransformerLens' forward of the same weights (float64),
    saved by TransformerLens into ``folder``."""
    model = random_model(options)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    hooked = to_hooked_transformer(model)
    logits, cache = hooked.run_with_cache(tokens)
    ours, our_cache = model.run_with_cache(tokens)
    lp = float((ours.log_softmax(-1) - logits.log_softmax(-1)).abs().max())
    pat = max(
        float(
            (our_cache[f"blocks.{i}.attn.hook_pattern"] - cache[f"blocks.{i}.attn.hook_pattern"]).abs().max()
        )
        for i in range(model.cfg.n_layers)
    )
    save_transformer_lens(hooked, folder)
    return lp, pat


def analysed(folder: Path, out: Path) -> tuple[list[str], dict[str, str], float]:
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "qkov.cli", "analyze", str(folder), "--out", str(out), "--quiet"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if run.returncode:
        raise RuntimeError(run.stderr.strip().splitlines()[-1])
    results = json.loads((out / "results.json").read_text())
    ran = [k for k, v in results.items() if v not in (None, [], {}) and k not in NOT_STEPS]
    return ran, results["skipped"], elapsed


NOT_STEPS = {"config", "tokens", "training", "phase_change", "schema_version", "skipped", "circuit_notes"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/families")
    parser.add_argument("--only", default="")
    parser.add_argument("--transformer-lens", action="store_true", help="one row per TransformerLens option")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    cases = CASES.items() if args.transformer_lens else family_configs()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    source = "TransformerLens" if args.transformer_lens else "transformers"
    first = "option" if args.transformer_lens else "family"
    columns = [first, "imports", f"log-prob vs {source}", "attention", "steps run",
               "not exact under a feature; other skips", "time"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for name, config in cases:
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                if args.transformer_lens:
                    lp, pat = tl_agreement(config, Path(tmp) / "tl")
                    ran, skipped, seconds = analysed(
                        Path(tmp) / "tl", Path(args.out) / name.replace(" ", "_")
                    )
                else:
                    lp, pat = agreement(name, config, Path(tmp))
                    ran, skipped, seconds = analysed(Path(tmp) / "bf16", Path(args.out) / name)
            except Exception as err:  # a row that says what failed, then the next family
                print(f"| {name} | no: {err} | | | | | |")
                continue
        feature = [f"{k} ({v.split(':')[0].removeprefix('not exact under ')})" for k, v in skipped.items()
                   if v.startswith("not exact under")]  # fmt: skip
        other = len(skipped) - len(feature)
        why = ", ".join(feature) or "none"
        row = [name, "yes", f"{lp:.1e}", f"{pat:.1e}", str(len(ran)), f"{why}; {other} not applicable"]
        print("| " + " | ".join([*row, f"{seconds:.1f} s"]) + " |")


if __name__ == "__main__":
    main()
