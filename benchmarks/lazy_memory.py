"""Lazy against eager loading for a weights-only analysis, side by side in one run: random Llama
models of one width at a few depths (built locally by ``transformers``, nothing downloaded), saved
in bfloat16 and sharded as Hugging Face writes them, each opened by ``qkov.open_model(path)`` (read
whole, folded) and by ``qkov.open_model(path, lazy=True)`` (mapped, one layer at a time), then
analysed by the weight-side steps (``qkov.analyze.run_steps(..., weights_only=True)``) in a fresh
process: its peak resident memory above its RSS after the imports (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``; glibc's mmap threshold fixed as ``qkov analyze --weights-only`` fixes it,
:func:`qkov.machine.return_freed_blocks`) and its wall time, open and analysis together. The
machine's one-thread float32 matmul rate is printed first (these machines differ by 2x from one
session to the next).

    flock /tmp/qkov-heavy.lock python benchmarks/lazy_memory.py               # about 6 minutes
    flock /tmp/qkov-heavy.lock python benchmarks/lazy_memory.py --layers 2,4  # a quicker look
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

from qkov.machine import matmul_rate

SRC = Path(__file__).resolve().parent.parent / "src"
STEPS = (  # every step that reads the weights alone and applies to a Llama
    "spectra,copying_direct,copying,copying_comparison,qk_position_content,composition,induction_check,"
    "rotary_bands,gqa_groups,neurons"
)
MEASURE = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import qkov
    from qkov.analyze import run_steps
    from qkov.machine import return_freed_blocks

    return_freed_blocks()  # as qkov analyze --weights-only does: the peak of what is alive

    def status(key):  # kB, of this process's own memory
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])

    with open("/proc/self/clear_refs", "w") as f:  # the imports' peak forgotten
        f.write("5")
    before, started = status("VmRSS:"), time.perf_counter()
    model = qkov.open_model(sys.argv[1], lazy=sys.argv[2] == "lazy")
    opened = time.perf_counter()
    run_steps(model, sys.argv[3].split(","), weights_only=True)
    done = time.perf_counter()
    print(json.dumps([(status("VmHWM:") - before) * 1024, opened - started, done - opened]))
    """
)


def build(folder: Path, layers: int, args: argparse.Namespace) -> int:
    """A random Llama of ``layers`` layers saved in bfloat16, sharded; its bytes on disk."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=args.d_model,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.d_mlp,
        vocab_size=args.vocab,
        num_hidden_layers=layers,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: the parent stays small
    try:
        model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder, max_shard_size=args.shard)
    del model
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def measure(folder: Path, mode: str) -> tuple[int, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(folder), mode, STEPS],
        capture_output=True, text=True, check=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", default="2,8,16")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--d-mlp", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--shard", default="50MB")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rate = matmul_rate()
    torch.set_num_threads(threads)
    print(f"fp32 matmul rate, one thread: {rate / 1e9:.0f} GFLOP/s; analyses on {threads} thread(s)")
    print(
        f"random Llama: d_model {args.d_model}, {args.heads} query / {args.kv_heads} key-value heads, "
        f"d_mlp {args.d_mlp}, vocabulary {args.vocab}; bfloat16 shards of at most {args.shard}"
    )
    print(f"steps: {STEPS}")
    print(f"{'layers':>6} {'on disk':>9} {'eager peak':>11} {'eager time':>11}", end="")
    print(f" {'lazy peak':>10} {'lazy time':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (int(n) for n in args.layers.split(",")):
            folder = Path(tmp) / str(layers)
            size = build(folder, layers, args)
            eager, lazy = measure(folder, "eager"), measure(folder, "lazy")
            mib = 2**20
            row = f"{layers:>6} {size / mib:>5.0f} MiB {eager[0] / mib:>7.0f} MiB {sum(eager[1:]):>9.1f} s"
            print(row + f" {lazy[0] / mib:>6.0f} MiB {sum(lazy[1:]):>8.1f} s", flush=True)
            for file in folder.iterdir():
                file.unlink()


if __name__ == "__main__":
    main()
