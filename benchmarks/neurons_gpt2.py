"""The MLP-neuron step (``qkov.circuits.neurons``) on a GPT-2-small-shaped model: a random
``GPT2LMHeadModel`` (12 layers, d_mlp 3072, 50257 tokens; built locally, nothing downloaded),
imported with LayerNorm folded. Prints

1. the ``neurons`` step as ``qkov analyze`` runs it (top 10 neurons per layer, 10 tokens per list,
   the last layer's exact direct logit split on the repeated-token batch): time and peak memory;
2. every neuron's key tokens over the whole vocabulary for one layer (``50257 x 3072``), streamed
   (``qkov.neuron_keys``) beside the dense product and ``torch.topk`` of it: time, peak memory, ratio.

    flock /tmp/qkov-heavy.lock python benchmarks/neurons_gpt2.py --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from types import MappingProxyType

import torch

import qkov
from analyze_gpt2 import build
from qkov import analyze as A
from qkov.context import Context
from qkov.interop.fold import circuit_model

from peak_memory import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-ctx", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), args.n_ctx, args.layers)
        model = qkov.load(Path(tmp) / "qkov").eval()
    cfg = model.cfg
    shape = f"{cfg.d_vocab} x {cfg.d_mlp}"
    print(f"GPT-2-shaped: {cfg.n_layers} layers of {shape} neuron rows, {args.threads} threads")
    step = next(s for s in A.STEPS if s.name == "neurons")
    ctx = Context.of(model, None, 0, MappingProxyType({}))
    with torch.no_grad():
        circuit = ctx.circuit
        found, s, m = measure(lambda: step.run(ctx))
    what = f"top {found.top}, k {found.k}, data: {found.data}"
    print(f"  neurons step ({what})  {s:7.2f} s {m / 2**20:7.0f} MiB")
    print(f"  last layer split: max |sum of terms - logits| = {found.max_error:.2e}")

    def dense():
        keys = circuit.W_E @ circuit.blocks[0].mlp.W_in  # [d_vocab, d_mlp], the product built whole
        return keys.T.topk(10, dim=-1)

    with torch.no_grad():
        (values, ids), s_stream, m_stream = measure(lambda: qkov.neuron_keys(circuit_model(circuit), 0, k=10))
        want, s_dense, m_dense = measure(dense)
    assert torch.equal(ids, want.indices)
    print(f"  one layer's keys, every neuron: streamed {s_stream:6.2f} s {m_stream / 2**20:6.0f} MiB")
    print(f"  {'':32s}dense    {s_dense:6.2f} s {m_dense / 2**20:6.0f} MiB")
    print(f"  streamed / dense: time {s_stream / s_dense:.2f}x, memory {m_stream / max(m_dense, 1):.3f}x")


if __name__ == "__main__":
    main()
