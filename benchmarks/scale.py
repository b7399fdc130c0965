"""qkov's weight-side analysis at the shapes of the models researchers study, beside TransformerLens
in the same run: random Llama checkpoints written at the true shapes (bfloat16, sharded with a
``model.safetensors.index.json`` as Hugging Face writes them, nothing downloaded), each layer's
matrices drawn with a trained-like decaying spectrum (column ``k`` scaled by ``1 / (1 + k / 16)``)
or a flat one (Gaussian), then

- **qkov**: ``qkov analyze FOLDER --weights-only`` end to end in a fresh process (its own command
  line code, the model opened lazily, one layer at a time; at the 70B width its embeddings held
  narrow, in bfloat16, read a block of tokens at a time), each step's wall time, the process's
  peak resident memory (Linux ``VmHWM``), and the kernel's CPU time and minor page faults in the
  step (fresh pages: a tensor of 1 MiB or more allocated in a loop comes from the system each
  time under ``--lazy``, ``qkov.machine.return_freed_blocks``);
- **TransformerLens 3**: in a fresh process limited to ``--tl-limit`` GiB of address space, its
  ``HookedTransformer`` built from the same config with random weights, then every head's OV
  eigenvalue copying score (``(W_E @ model.OV @ W_U).eigenvalues``, as its docs compute it) and
  its K-composition scores (``model.all_composition_scores("K")``): each one's time, or the memory
  error it stops on.

Times are scaled to a 100 GFLOP/s float32 core (wall x the one-thread matmul rate measured first,
/ 100 GFLOP/s): these machines differ by 2x in matmul speed from one session to the next.

    flock /tmp/qkov-heavy.lock python benchmarks/scale.py --shape llama-3.2-1b
    flock /tmp/qkov-heavy.lock python benchmarks/scale.py --shape llama-3.1-8b --layers 2 \
        --steps spectra,copying --no-tl         # what one layer of 8B costs, and the fixed part
    flock /tmp/qkov-heavy.lock python benchmarks/scale.py --shape llama-3.1-70b-width \
        --steps spectra,copying,composition --no-tl
    flock /tmp/qkov-heavy.lock python benchmarks/scale.py --shape llama-3.2-1b --full --no-tl
                                        # every step, behaviour included (qkov analyze --lazy)
    git worktree add --detach ../old main && \
    flock /tmp/qkov-heavy.lock python benchmarks/scale.py --shape llama-3.2-1b --full --no-tl --old ../old
                                        # the code of ../old first, on the same checkpoint
                                        # (--abba: old, new, new, old)
    python benchmarks/scale.py --shape tiny            # the script itself, in a few seconds
    python benchmarks/scale.py --shape llama-3.1-8b --device cuda    # on one GPU (gpu_checks.sh)

On a GPU the model is drawn there, qkov analyzes it with ``--device cuda`` (its blocks read from
the mapped files one at a time and moved to the GPU) and each step's peak GPU memory is printed
beside its time; TransformerLens runs on the GPU too, its memory the limit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from qkov.machine import matmul_rate

from side_by_side import add_arguments, check_arguments, ratio_line, run_order

SRC = Path(__file__).resolve().parent.parent / "src"
GiB = 2**30
SHAPES = {  # the published configs' shapes (Llama 3.2 1B ties its embeddings)
    "llama-3.2-1b": dict(
        layers=16, d_model=2048, heads=32, kv_heads=8, d_head=64, d_mlp=8192, tied=True, factor=32
    ),
    "llama-3.1-8b": dict(
        layers=32, d_model=4096, heads=32, kv_heads=8, d_head=128, d_mlp=14336, tied=False, factor=8
    ),
    "llama-3.1-70b-width": dict(
        layers=2, d_model=8192, heads=64, kv_heads=8, d_head=128, d_mlp=28672, tied=False, factor=8
    ),
    "tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, d_head=16, d_mlp=128, tied=False, factor=8),
}
VOCAB = {"tiny": 512}  # every other shape: Llama 3's 128,256 tokens
SHARD_BYTES = 5 * GiB  # transformers' default max_shard_size

QKOV = textwrap.dedent(
    """
    import dataclasses, json, resource, sys, time
    import torch
    import qkov.analyze as analyze
    from qkov.cli import main

    times, peaks, gpu_peaks, faults = {}, {}, {}, {}
    gpu = sys.argv[4] != "cpu"

    def hwm():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024

    def timed(step):
        def run(ctx):
            with open("/proc/self/clear_refs", "w") as f:  # this step's own peak
                f.write("5")
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            try:
                return step.run(ctx)
            finally:
                if gpu:
                    torch.cuda.synchronize()
                    gpu_peaks[step.name] = torch.cuda.max_memory_allocated()
                times[step.name], peaks[step.name] = time.perf_counter() - started, hwm()
                after = resource.getrusage(resource.RUSAGE_SELF)  # the kernel's share: fresh pages
                faults[step.name] = (after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt)
                line = f"{step.name}: {times[step.name]:.1f} s, peak {peaks[step.name] >> 20} MiB"
                print(line, file=sys.stderr, flush=True)
        return dataclasses.replace(step, run=run)

    analyze.STEPS = tuple(timed(step) for step in analyze.STEPS)
    started = time.perf_counter()
    try:
        steps = ["--steps", sys.argv[3]] if sys.argv[3] else []
        device = ["--device", sys.argv[4]]
        main(["analyze", sys.argv[1], sys.argv[5], "--quiet", "--out", sys.argv[2], *steps, *device])
    except SystemExit as done:
        assert not done.code, done.code
    peak = max([hwm(), *peaks.values()])
    found = {"total": time.perf_counter() - started, "steps": times, "peaks": peaks, "peak": peak}
    found["faults"] = faults
    print(json.dumps(found | {"gpu_peaks": gpu_peaks}))
    """
)

TRANSFORMER_LENS = textwrap.dedent(
    """
    import json, resource, sys, time
    limit, device = int(sys.argv[2]), sys.argv[3]
    if device == "cpu":  # on a GPU its own memory is the limit (CUDA maps far more address space)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    shape = json.loads(sys.argv[1])
    out = {}

    def attempt(name, work):
        started = time.perf_counter()
        try:
            value = work()
            if device != "cpu":
                torch.cuda.synchronize()
            out[name] = {"seconds": time.perf_counter() - started}
            return value
        except (MemoryError, RuntimeError) as err:
            out[name] = {"error": type(err).__name__ + ": " + str(err).splitlines()[0][:260]}
        finally:
            print(json.dumps(out), flush=True)

    cfg = HookedTransformerConfig(
        n_layers=shape["layers"], d_model=shape["d_model"], n_heads=shape["heads"], d_head=shape["d_head"],
        d_mlp=shape["d_mlp"], d_vocab=shape["vocab"], n_ctx=2048, act_fn="silu", normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=shape["d_head"], n_key_value_heads=shape["kv_heads"],
        gated_mlp=True, final_rms=True, seed=0, device=device,
    )
    model = attempt("build", lambda: HookedTransformer(cfg))
    if model is not None:
        with torch.no_grad():
            attempt("OV eigenvalue copying", lambda: (model.W_E @ model.OV @ model.W_U).eigenvalues)
            attempt("K-composition", lambda: model.all_composition_scores("K"))
    """
)


def draw(rows: int, cols: int, spectrum: str, generator: torch.Generator) -> torch.Tensor:
    """A ``[rows, cols]`` bfloat16 matrix (on the CPU) of unit-variance rows' scale: Gaussian, its
    columns scaled by ``1 / (1 + k / 16)`` for the trained-like spectrum; drawn on the generator's
    device (a GPU draws an 8B model in seconds)."""
    x = torch.randn(rows, cols, generator=generator, device=generator.device) / math.sqrt(cols)
    if spectrum == "decaying":
        x *= 1 / (1 + torch.arange(cols, device=generator.device) / 16)
    return x.to(torch.bfloat16).cpu()


def layer_tensors(layer: int, s: dict, spectrum: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One Llama layer in Hugging Face's names and ``[out, in]`` layout."""
    p, d = f"model.layers.{layer}.", s["d_model"]
    shapes = {
        "self_attn.q_proj": (s["heads"] * s["d_head"], d),
        "self_attn.k_proj": (s["kv_heads"] * s["d_head"], d),
        "self_attn.v_proj": (s["kv_heads"] * s["d_head"], d),
        "self_attn.o_proj": (d, s["heads"] * s["d_head"]),
        "mlp.gate_proj": (s["d_mlp"], d),
        "mlp.up_proj": (s["d_mlp"], d),
        "mlp.down_proj": (d, s["d_mlp"]),
    }
    out = {p + name + ".weight": draw(*shape, spectrum, generator) for name, shape in shapes.items()}
    for norm in ("input_layernorm", "post_attention_layernorm"):
        norm_weight = 1 + 0.1 * torch.randn(d, generator=generator, device=generator.device)
        out[p + norm + ".weight"] = norm_weight.to(torch.bfloat16).cpu()
    return out


def write_checkpoint(folder: Path, s: dict, spectrum: str, device: str) -> int:
    """The config, the shards and the index, a shard written as soon as it is full (the parent
    never holds more than a shard), drawn on ``device``; the bytes written."""
    import transformers
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = transformers.LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["d_model"], intermediate_size=s["d_mlp"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=s["d_head"], max_position_embeddings=131072, tie_word_embeddings=s["tied"],
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3", "factor": float(s["factor"]), "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        },
    )  # fmt: skip
    config.save_pretrained(folder)
    generator = torch.Generator(device).manual_seed(0)
    groups = [{"model.embed_tokens.weight": draw(s["vocab"], s["d_model"], spectrum, generator)}]
    groups += [
        lambda layer=layer: layer_tensors(layer, s, spectrum, generator) for layer in range(s["layers"])
    ]
    ends = {"model.norm.weight": torch.ones(s["d_model"], dtype=torch.bfloat16)}
    if not s["tied"]:
        ends["lm_head.weight"] = draw(s["vocab"], s["d_model"], spectrum, generator)
    groups.append(ends)
    shards: list[list[str]] = []  # each shard's tensor names: a full shard is written and let go
    current, size, total = {}, 0, 0

    def flush() -> None:
        shards.append(list(current))
        save_file(current, folder / f"shard-{len(shards)}.tmp")
        current.clear()

    for group in groups:
        tensors = group() if callable(group) else group
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if current and size + nbytes > SHARD_BYTES:
            flush()
            size = 0
        current |= tensors
        size, total = size + nbytes, total + nbytes
    flush()
    weight_map = {}
    for index, names in enumerate(shards, 1):
        name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        (folder / f"shard-{index}.tmp").rename(folder / name)
        weight_map |= dict.fromkeys(names, name)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def run_qkov(folder: Path, out: Path, steps: str, device: str, mode: str, src: Path = SRC) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run(  # each step's line on stderr as it ends, to follow a long run
        [sys.executable, "-c", QKOV, str(folder), str(out), steps, device, mode],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit("qkov analyze failed (its error above)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_transformer_lens(s: dict, limit: int, device: str, timeout: float) -> dict:
    command = [sys.executable, "-c", TRANSFORMER_LENS, json.dumps(s), str(limit), device]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as stopped:  # what it finished, and the step it was in
        done = subprocess.CompletedProcess(command, -9, stopped.stdout or "", f"stopped after {timeout:g} s")
        done.stdout = done.stdout.decode() if isinstance(done.stdout, bytes) else done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    found = json.loads(lines[-1]) if lines else {}
    if done.returncode and len(found) < 3:  # killed (or failed) inside a step: the step it was in
        step = ("build", "OV eigenvalue copying", "K-composition")[len(found)]
        found[step] = {"error": f"the process ended ({done.returncode}): {done.stderr.strip()[-160:]}"}
    return found


def report(got: dict, scale: float, on_gpu: bool, mode: str) -> None:
    """qkov's total and each step's time (scaled on the CPU) and peak memory (the GPU's too)."""
    scaled = "" if on_gpu else f", {got['total'] * scale:.1f} s scaled"
    print(f"qkov analyze {mode}: {got['total']:.1f} s wall{scaled}, peak {got['peak'] / GiB:.2f} GiB")
    for step, seconds in got["steps"].items():
        peak = f"peak {got['peaks'][step] / GiB:5.2f} GiB"
        if on_gpu:
            print(f"  {step:22s} {seconds:8.1f} s wall, {peak}, GPU {got['gpu_peaks'][step] / GiB:5.2f} GiB")
        else:
            system, faults = got["faults"][step]
            print(
                f"  {step:22s} {seconds:8.1f} s wall {seconds * scale:8.1f} s scaled, {peak}, "
                f"system {system:5.1f} s, {faults / 1e6:5.2f} M page faults"
            )


def report_transformer_lens(found: dict, scale: float, on_gpu: bool) -> None:
    for step, result in found.items():
        if "seconds" not in result:
            print(f"  {step:22s} fails: {result['error']}")
        elif on_gpu:
            print(f"  {step:22s} {result['seconds']:8.1f} s wall")
        else:
            print(f"  {step:22s} {result['seconds']:8.1f} s wall {result['seconds'] * scale:8.1f} s scaled")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=SHAPES, default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, help="fewer layers than the model has (default: all)")
    parser.add_argument("--spectrum", choices=("decaying", "flat"), default="decaying")
    parser.add_argument("--device", default="cpu", help="qkov analyze --device, and TransformerLens' (cpu)")
    parser.add_argument(
        "--tl-limit", type=float, default=8.0, help="GiB of address space for TransformerLens on the CPU"
    )
    parser.add_argument("--tl-timeout", type=float, default=1800, help="seconds TransformerLens may run")
    parser.add_argument("--no-tl", action="store_true", help="leave TransformerLens out")
    parser.add_argument("--steps", default="", help="qkov analyze --steps (default: every weights-only step)")
    add_arguments(parser)
    parser.add_argument(
        "--full",
        action="store_true",
        help="every step, behaviour included (qkov analyze --lazy: each forward pass reads the layers "
        "again), not --weights-only",
    )
    args = parser.parse_args()
    s = dict(SHAPES[args.shape], vocab=VOCAB.get(args.shape, 128256))
    s["layers"] = args.layers or s["layers"]
    on_gpu = args.device != "cpu"
    # Decided before the matmul rate and the checkpoint (minutes and GiB at the real shapes).
    bench_dir = os.environ.get("QKOV_BENCH_DIR")
    if bench_dir is not None and not Path(bench_dir).is_dir():
        parser.error(f"QKOV_BENCH_DIR={bench_dir} is not a directory (the checkpoint is written there)")
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be at least 1, got {args.layers}")
    if on_gpu and not torch.cuda.is_available():
        parser.error(f"--device {args.device}, but no CUDA device is available here")
    check_arguments(parser, args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rate = matmul_rate()
    torch.set_num_threads(threads)
    scale = rate / 100e9
    print(
        f"fp32 matmul rate, one thread: {rate / 1e9:.0f} GFLOP/s (wall x {scale:.2f} = scaled); "
        f"{threads} threads" + (f"; {torch.cuda.get_device_name()}" if on_gpu else "")
    )
    print(f"{args.shape}: {json.dumps(s)}, {args.spectrum} spectrum")
    with tempfile.TemporaryDirectory(dir=bench_dir) as tmp:
        started = time.perf_counter()
        size = write_checkpoint(Path(tmp) / "model", s, args.spectrum, args.device)
        shards = len(list((Path(tmp) / "model").glob("*.safetensors")))
        print(f"written: {size / GiB:.2f} GiB in {shards} shards, {time.perf_counter() - started:.0f} s")
        mode = "--lazy" if args.full else "--weights-only"
        runs = run_order(args.old / "src", SRC, args.abba) if args.old else [("new", SRC)]
        walls: dict[str, list[float]] = {"old": [], "new": []}
        for index, (name, src) in enumerate(runs):  # in run_order's order, each in a fresh process
            out = Path(tmp) / f"out-{index}-{name}"
            got = run_qkov(Path(tmp) / "model", out, args.steps, args.device, mode, src)
            report(got, scale, on_gpu, mode + (f" ({name} code)" if args.old else ""))
            walls[name].append(got["total"])
        if args.old:
            print(ratio_line(walls))
    if args.no_tl:
        return
    limit = "its GPU's memory" if on_gpu else f"address space limited to {args.tl_limit:g} GiB"
    print(f"TransformerLens ({args.device}, {limit}):")
    found = run_transformer_lens(s, int(args.tl_limit * GiB), args.device, args.tl_timeout)
    report_transformer_lens(found, scale, on_gpu)


if __name__ == "__main__":
    main()
