"""Lazy, streamed weights (:mod:`qkov.interop.lazy`): a model opened with ``lazy=True`` gives the
weight-side analyses the same results as the model read whole, in memory that does not grow with its
depth, and a damaged shard is one line."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import qkov
import qkov.checkpoint
from families import family_configs, random_hf_model
from qkov.analyze import STEPS, TOKENS, run_steps
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.interop.lazy_model import KEEP, LazyMLP, LazyTransformer

CASES = dict(family_configs())
SRC = Path(__file__).resolve().parent.parent / "src"


def weight_steps(cfg) -> list[str]:
    """The steps a weights-only run of a model of ``cfg`` makes (no corpus, no user data)."""
    return [s.name for s in STEPS if s.inputs != TOKENS and s.skip_reason(cfg, False) is None]


def assert_same(a, b, where: str = "result") -> None:
    """``a`` and ``b`` equal, floats (and tensors) to float rounding."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True, msg=where)
    elif isinstance(a, float):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
        assert same, f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def saved(tmp_path: Path, name: str, shard: str | None = "20KB") -> Path:
    """A random model of the family case ``name`` saved as ``transformers`` saves it, in bfloat16
    (sharded when ``shard`` is a size)."""
    model = random_hf_model(CASES[name]).to(torch.bfloat16)
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    return tmp_path


# llama: grouped-query attention and rotary; gemma2: post-norms, soft-caps, Gemma's 1 + w, float64
# embedding; qwen3: query/key norms; gpt_neox: LayerNorm, partial rotary, parallel blocks; opt and
# gpt2: LayerNorm, learned positions, biases (gpt2 is read by its own adapter); olmo2: norms only
# after each sublayer
FAMILIES = ["llama", "gemma2", "qwen3", "gpt_neox", "opt", "gpt2-inverse-layer", "olmo2"]


@pytest.mark.parametrize("name", FAMILIES)
def test_lazy_analyses_equal_eager(tmp_path, name):
    folder = saved(tmp_path, name, shard=None if name == "opt" else "20KB")
    eager, lazy = qkov.open_model(folder), qkov.open_model(folder, lazy=True)
    assert isinstance(lazy, LazyTransformer) and lazy.cfg == eager.cfg
    steps = weight_steps(eager.cfg)
    assert {"spectra", "copying", "qk_position_content"} <= set(steps)
    assert_same(run_steps(eager, steps, weights_only=True), run_steps(lazy, steps, weights_only=True))


def test_circuits_read_the_lazy_model_folded_and_viewed(tmp_path):
    """Every head's factors and the ends equal the eager circuit model's; the blocks kept are at
    most :data:`KEEP`; a circuit model of a lazy model is lazy, built once per offsets."""
    folder = saved(tmp_path, "llama")
    eager = circuit_model(qkov.open_model(folder))
    lazy_model = qkov.open_model(folder, lazy=True)
    lazy = circuit_model(lazy_model)
    assert isinstance(lazy, LazyTransformer) and lazy.cfg == eager.cfg
    assert circuit_model(lazy_model) is lazy and circuit_model(lazy) is lazy
    for name in ("W_E", "W_U"):
        torch.testing.assert_close(getattr(lazy, name), getattr(eager, name), rtol=0, atol=0)
    for layer, block in enumerate(lazy.blocks):
        assert not any(name.startswith("mlp.") for name, _ in block.named_parameters())  # not read yet
        assert block.mlp.W_in is not None  # read when first asked for (the view's: the folded block's)
        ours, theirs = dict(block.named_parameters()), dict(eager.blocks[layer].named_parameters())
        assert ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-6, atol=1e-6)
    assert len(lazy.blocks.kept) <= KEEP
    qkov.full_qk_circuit(lazy_model, offset=3)  # another offset: another lazy view
    assert len(lazy_model._circuits) == 2


def moved_alike(tmp_path: Path, to) -> tuple[torch.nn.Module, LazyTransformer]:
    """A random Llama read whole and opened lazily, both moved by ``to`` (a device or a dtype)."""
    folder = saved(tmp_path, "llama")
    return qkov.open_model(folder).to(to), qkov.open_model(folder, lazy=True).to(to)


def assert_moved(lazy: LazyTransformer, device: torch.device, dtype: torch.dtype) -> None:
    """Every tensor of ``lazy``, of its blocks, of its circuit view and of the view's blocks on
    ``device`` in ``dtype``."""
    for model in (lazy, circuit_model(lazy)):
        tensors = [*model.parameters(), *(t for block in model.blocks for t in block.parameters())]
        assert {(t.device, t.dtype) for t in tensors} == {(device, dtype)}


def test_lazy_model_moves_its_blocks_as_it_builds_them(tmp_path):
    """``.to(dtype)`` on a lazy model converts its ends at once and each block as it is built (the
    circuit view's too, made again from the converted ends); the analyses equal those of the model
    read whole and converted alike."""
    circuit_model(lazy := qkov.open_model(saved(tmp_path / "a", "llama"), lazy=True))
    lazy.blocks[0]
    lazy.double()  # after a view and a block were made: both are made again, converted
    assert not lazy._circuits and not lazy.blocks.kept
    assert_moved(lazy, torch.device("cpu"), torch.float64)
    eager, lazy = moved_alike(tmp_path / "b", torch.float64)
    assert_moved(lazy, torch.device("cpu"), torch.float64)
    steps = weight_steps(eager.cfg)
    assert_same(run_steps(eager, steps, weights_only=True), run_steps(lazy, steps, weights_only=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lazy_model_on_a_gpu(tmp_path):
    """A lazy model moved to the GPU builds its blocks there; its analyses equal the CPU's."""
    eager, lazy = moved_alike(tmp_path, "cuda")
    assert_moved(lazy, torch.device("cuda", 0), torch.float32)
    steps = weight_steps(eager.cfg)
    assert_same(run_steps(eager, steps, weights_only=True), run_steps(lazy, steps, weights_only=True))


def test_folding_in_place_leaves_the_file_and_the_tied_embedding_alone(tmp_path):
    """Folding overwrites the tensors it is given (no 2 GiB copy of Llama 3's unembedding made to
    scale or centre it): a lazy model of a float32 checkpoint with a tied unembedding (tensors
    already in the compute dtype, read from the mapped file, ``W_U`` read from the embedding's
    bytes) folds tensors of its own: its ends and blocks equal the model read whole's exactly, and
    the file's bytes are unchanged."""
    config = type(CASES["llama"])(**(CASES["llama"].to_dict() | {"tie_word_embeddings": True}))
    random_hf_model(config).to(torch.float32).save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    eager, lazy = qkov.open_model(tmp_path), qkov.open_model(tmp_path, lazy=True)
    assert not torch.equal(lazy.W_U, lazy.W_E.T)  # W_U folded and centred, W_E not
    for name in ("W_E", "W_U"):
        torch.testing.assert_close(getattr(lazy, name), getattr(eager, name), rtol=0, atol=0)
    assert lazy.blocks[0].mlp.W_in is not None  # the MLP too, read when first used
    ours, theirs = dict(lazy.blocks[0].named_parameters()), dict(eager.blocks[0].named_parameters())
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0)
    assert (tmp_path / "model.safetensors").read_bytes() == before


def test_attention_steps_leave_the_mlp_unread(tmp_path, monkeypatch):
    """The steps that read attention alone never read an MLP (at Llama-3.1-8B's shapes 704 of a
    layer's 872 MiB in float32); the neurons step reads them, each once per layer read."""
    lazy, reads = qkov.open_model(saved(tmp_path, "llama"), lazy=True), []
    real = LazyMLP._read
    monkeypatch.setattr(LazyMLP, "_read", lambda mlp: reads.append(mlp) or real(mlp))
    attention = ["spectra", "copying", "copying_direct", "composition", "induction_check"]
    run_steps(lazy, attention, weights_only=True)
    assert reads == []
    run_steps(lazy, ["neurons"], weights_only=True)
    assert len(reads) >= lazy.cfg.n_layers


def test_each_step_reads_each_layer_a_few_times(tmp_path, monkeypatch):
    """With one block kept (:data:`KEEP`), no weights-only step reads the layers more than three
    times over: a step that went back and forth between layers (reading O(layers^2) blocks) would
    fail here, on a 6-layer model."""
    import qkov.interop.lazy as lazy_module

    config = type(CASES["llama"])(**(CASES["llama"].to_dict() | {"num_hidden_layers": 6}))
    random_hf_model(config).to(torch.bfloat16).save_pretrained(tmp_path)
    reads, real = [], lazy_module.model_block
    monkeypatch.setattr(
        lazy_module, "model_block", lambda source, layer: reads.append(layer) or real(source, layer)
    )
    lazy = qkov.open_model(tmp_path, lazy=True)
    for step in weight_steps(lazy.cfg):
        reads.clear()
        run_steps(lazy, [step], weights_only=True)
        assert len(reads) <= 3 * 6, f"{step} read {len(reads)} blocks"


def test_a_layer_is_converted_in_the_order_its_bytes_are_stored(tmp_path):
    """Hugging Face stores ``up_proj`` as ``[d_mlp, d_model]``; qkov's ``W_in`` is its transpose, and
    the lazy read keeps it a transposed view of a float32 copy in the file's order (no transposing
    copy), with the numbers of the model read whole."""
    folder = saved(tmp_path, "llama")
    eager, lazy = qkov.open_model(folder), qkov.open_model(folder, lazy=True)
    W_in = lazy.blocks[1].mlp.W_in
    assert W_in.dtype == torch.float32 and not W_in.is_contiguous() and W_in.mT.is_contiguous()
    torch.testing.assert_close(W_in, eager.blocks[1].mlp.W_in, rtol=0, atol=0)
    assert lazy.W_U.is_contiguous()  # the ends, read a block of tokens at a time, stay contiguous


def test_lazy_forward_runs_layer_by_layer(tmp_path):
    folder = saved(tmp_path, "gemma2")
    eager, lazy = qkov.open_model(folder), qkov.open_model(folder, lazy=True)
    tokens = torch.randint(0, eager.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lazy(tokens), eager(tokens), rtol=1e-6, atol=1e-6)
    with pytest.raises(QkovError, match="a lazy model .* cannot be saved"):
        qkov.save(lazy, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_lazy_qkov_checkpoint(tmp_path):
    """A qkov checkpoint (one file, its checksum checked at open) opens lazily too."""
    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=23, n_ctx=12)
    model = qkov.Transformer(cfg)
    qkov.save(model, tmp_path / "ckpt")
    lazy = qkov.open_model(tmp_path / "ckpt", lazy=True)
    steps = weight_steps(cfg)
    assert_same(run_steps(model, steps, weights_only=True), run_steps(lazy, steps, weights_only=True))
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x40
    weights.write_bytes(bytes(data))
    with pytest.raises(QkovError, match="do not match the checksum") as err:
        qkov.open_model(tmp_path / "ckpt", lazy=True)
    assert "\n" not in str(err.value)


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("model-*.safetensors"))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-100]), "truncated or corrupt safetensors file"),
        (
            lambda f: f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"),
            "truncated or corrupt",
        ),
        (lambda f: f.write_bytes(f.read_bytes()[:6]), "truncated or corrupt"),
        (lambda f: f.unlink(), "missing"),
    ],
)
def test_damaged_shard_is_one_line(tmp_path, damage, message):
    folder = saved(tmp_path, "llama")
    shards = _shards(folder)
    assert len(shards) > 1
    damage(shards[-1])
    with pytest.raises(QkovError, match=message) as err:
        qkov.open_model(folder, lazy=True)
    assert "\n" not in str(err.value) and shards[-1].name in str(err.value)


def test_shard_damaged_after_open_is_one_line(tmp_path):
    """A shard cut short after the model was opened: one line when the layer is read (reading the
    mapped bytes past the file's end would kill the process), and a non-finite weight names itself."""
    folder = saved(tmp_path, "llama")
    lazy = circuit_model(qkov.open_model(folder, lazy=True))
    last = _shards(folder)[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(QkovError, match="cannot read its tensors any more") as err:
        [block for block in lazy.blocks]
    assert "\n" not in str(err.value)


def test_non_finite_weight_is_one_line(tmp_path):
    model = random_hf_model(CASES["llama"]).to(torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 4] = torch.nan
    model.save_pretrained(tmp_path)
    lazy = qkov.open_model(tmp_path, lazy=True)  # nothing of layer 1 read yet
    assert lazy.blocks[0].mlp.W_in is not None
    block = lazy.blocks[1]  # its attention: the MLP is read when first used
    with pytest.raises(QkovError, match="blocks.1.mlp.W_in has non-finite values") as err:
        block.mlp(torch.zeros(1, lazy.cfg.d_model))
    assert "\n" not in str(err.value)
    with pytest.raises(QkovError, match="blocks.1.mlp.W_in has non-finite values"):  # not taken as checked
        lazy.blocks[1].mlp(torch.zeros(1, lazy.cfg.d_model))


def test_a_part_read_again_is_not_checked_again(tmp_path, monkeypatch):
    """A layer's values are checked for NaN and infinity when it is first built, in the model and
    in its circuit view, and not at its later reads (the same mapped bytes)."""
    random_hf_model(CASES["llama"]).save_pretrained(tmp_path)
    lazy = qkov.open_model(tmp_path, lazy=True)
    view = circuit_model(lazy)
    checked = []
    monkeypatch.setattr(qkov.checkpoint, "all_finite", lambda t: checked.append(t.shape) or True)
    x = torch.zeros(1, lazy.cfg.d_model, dtype=lazy.W_U.dtype)
    passes = []
    for _ in range(2):  # every block of both, twice: a lazy model keeps one block at a time
        for model in (lazy, view):
            for block in model.blocks:
                block.mlp(x)
        passes.append(len(checked))
    assert passes[0] > 0 and passes[1] == passes[0]


def test_lazy_refuses_what_it_cannot_map(tmp_path):
    model = random_hf_model(CASES["llama"])
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    qkov.open_model(tmp_path)  # read whole, it opens
    with pytest.raises(QkovError, match="lazy reading needs safetensors"):
        qkov.open_model(tmp_path, lazy=True)


# -- peak memory against depth ---------------------------------------------------------------------
MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch
    import qkov
    from qkov.analyze import run_steps

    def status(key):  # kB, of this process's own memory
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])

    torch.set_num_threads(1)
    with open("/proc/self/clear_refs", "w") as f:  # the peak so far (the imports') forgotten
        f.write("5")
    before = status("VmRSS:")
    modes = {"eager": {}, "lazy": {"lazy": True, "narrow": False}, "narrow": {"lazy": True, "narrow": True}}
    model = qkov.open_model(sys.argv[1], **modes[sys.argv[2]])
    run_steps(model, sys.argv[3].split(","), weights_only=True)
    print(json.dumps((status("VmHWM:") - before) * 1024))
    """
)
MEMORY_STEPS = (  # every step that reads weights alone and applies to a Llama
    "spectra,copying_direct,copying,copying_comparison,qk_position_content,composition,induction_check,"
    "rotary_bands,gqa_groups,neurons"
)
WIDTH = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=2048)


def peak_bytes(folder: Path, mode: str, steps: str = MEMORY_STEPS, script: str = MEASURE) -> int:
    """Peak RSS growth (bytes) of a weights-only analysis (or of ``script``, given the same
    arguments) in a fresh process, over its RSS after its imports: Linux's ``VmHWM``, the imports'
    own peak reset through ``/proc/self/clear_refs``.
    Not ``ru_maxrss``: a child's starts at its parent's RSS when it forked (kept across exec), so
    it would measure the test process that built the models."""
    # glibc's malloc serves blocks below a threshold that rises (to 32 MiB) with every larger block
    # freed from its heap, which it keeps: the peak then depends on the history of allocations, by
    # 20-40 MiB here between two depths, not on what is alive. A fixed threshold measures the latter.
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    out = subprocess.run(
        [sys.executable, "-c", script, str(folder), mode, steps],
        capture_output=True, text=True, env=env, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def saved_at_depth(folder: Path, layers: int) -> Path:
    """A Llama of :data:`WIDTH` (vocabulary 2048) and ``layers`` layers, in bfloat16, sharded."""
    import transformers

    config = transformers.LlamaConfig(
        **WIDTH, vocab_size=2048, num_hidden_layers=layers, max_position_embeddings=256
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="20MB")
    return folder


MiB = 2**20
# What the analyses keep of every layer: the induction check's writers' W_V and W_O (d_model x d_head
# each per head, 2 x 8 x 64 x 512 x 4 B = 2 MiB a layer; composition's writer rows are half that), all
# of them within the default budget at this size (a deeper model is scored in groups that fit it).
# Every other step holds one layer at a time. A layer's weights in float32 (15 MiB here) kept would
# break the bound below.
KEPT_PER_LAYER = 2 * 8 * 64 * 512 * 4
SLACK = 32 * MiB  # page noise between two runs, and the results' own objects


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs")
def test_lazy_peak_memory_does_not_grow_with_depth(tmp_path):
    """Two models of the same width, 2 and 16 layers, through every weights-only step: the lazy
    analysis's peak grows by at most the writers' factors the composition steps hold
    (:data:`KEPT_PER_LAYER` a layer) and :data:`SLACK` (measured: 217 -> 271 MiB); keeping the
    layers' weights (15 MiB a layer in float32), or every head's factors as the analyses once
    stacked them (about 12 MiB a layer), would break that bound, and the model read whole does (its
    peak grows by about 900 MiB here: 255 -> 1135 MiB)."""
    shallow, deep = saved_at_depth(tmp_path / "2", 2), saved_at_depth(tmp_path / "16", 16)
    lazy = {n: peak_bytes(f, "lazy") for n, f in ((2, shallow), (16, deep))}
    eager = {n: peak_bytes(f, "eager") for n, f in ((2, shallow), (16, deep))}
    bound = 14 * KEPT_PER_LAYER + SLACK
    report = f"lazy {lazy[2] / MiB:.0f} -> {lazy[16] / MiB:.0f} MiB, "
    report += f"eager {eager[2] / MiB:.0f} -> {eager[16] / MiB:.0f} MiB"
    assert lazy[16] - lazy[2] <= bound, report
    assert eager[16] - eager[2] > bound, report


# -- narrow ends ---------------------------------------------------------------------------------
NARROW_STEPS = [step.name for step in STEPS if step.narrow_ends]


@pytest.mark.parametrize("name", FAMILIES)
def test_narrow_ends_equal_the_model_read_whole(tmp_path, name):
    """A lazy model holding its embedding and unembedding narrow (read a block of tokens at a time,
    folded as read) gives the results of the model read whole in every step that runs on it; its
    ends, block by block, are the whole model's folded ends (the unembedding's mean over the
    vocabulary taken apart, in float64: to float rounding)."""
    folder = saved(tmp_path, name, shard=None if name == "opt" else "20KB")
    eager, lazy = qkov.open_model(folder), qkov.open_model(folder, lazy=True, narrow=True)
    assert lazy.narrow and lazy.cfg == eager.cfg
    E, U = circuit_model(lazy).outer_factors()
    whole = circuit_model(eager)
    torch.testing.assert_close(torch.cat([rows for _, rows in E.blocks(7)]), whole.W_E, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([rows for _, rows in U.mT.blocks(7)]).mT, whole.W_U)
    torch.testing.assert_close(lazy.b_U, eager.b_U)
    steps = [step for step in weight_steps(eager.cfg) if step in NARROW_STEPS]
    assert {"spectra", "copying", "composition"} <= set(steps)
    assert_same(run_steps(eager, steps, weights_only=True), run_steps(lazy, steps, weights_only=True))


def test_narrow_model_runs_only_what_reads_its_ends_by_blocks(tmp_path, monkeypatch, capsys):
    """A narrow model refuses, in one line, a forward pass and the steps that read its ends whole;
    ``qkov analyze --weights-only`` of a model whose ends would take more than
    :data:`~qkov.interop.lazy.WHOLE_ENDS_BYTES` (made small here) holds them narrow by itself and
    says why each other step did not run; ``narrow=`` without ``lazy`` is one line."""
    import qkov.interop.lazy as lazy_module
    from qkov.analyze import NARROW_REASON
    from qkov.cli import main
    from qkov.results import load_results

    folder = saved(tmp_path / "hf", "llama")
    model = qkov.open_model(folder, lazy=True, narrow=True)
    with pytest.raises(QkovError, match="holds its embedding and unembedding narrow"):
        model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(QkovError, match="steps copying_direct: reads the embedding or unembedding whole"):
        run_steps(model, ["copying_direct"], weights_only=True)
    with pytest.raises(QkovError, match="give lazy=True"):
        qkov.open_model(folder, narrow=True)
    assert not qkov.open_model(folder, lazy=True).narrow  # small ends: held whole, by default
    monkeypatch.setattr(lazy_module, "WHOLE_ENDS_BYTES", 0)
    assert qkov.open_model(folder, lazy=True).narrow
    main(["analyze", str(folder), "--weights-only", "--quiet", "--out", str(tmp_path / "out")])
    capsys.readouterr()
    written = load_results(tmp_path / "out" / "results.json")
    assert set(written.steps.ran) == set(NARROW_STEPS) & set(weight_steps(model.cfg))
    for step in ("copying_direct", "qk_position_content", "neurons"):
        assert written.skipped[step] == NARROW_REASON
    eager = qkov.analyze(qkov.open_model(folder), show_progress=False, steps=written.steps.ran)
    for step in ("spectra", "copying", "composition", "gqa_groups"):
        assert_same(getattr(written, step), getattr(eager, step), step)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs")
def test_narrow_ends_are_never_held_whole(tmp_path):
    """A Llama of a wide vocabulary (131,072 x 512: float32 ends of 512 MiB, 256 MiB stored) through
    the narrow steps: holding the ends narrow peaks at least 200 MiB below holding them whole
    (their float32 copies, less what the narrow model maps of the stored ones; measured: 717 and
    389 MiB, the model read whole 2065)."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1024,
        vocab_size=131072, num_hidden_layers=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="100MB")
    steps = "spectra,copying,composition,induction_check"
    peaks = {mode: peak_bytes(tmp_path, mode, steps) for mode in ("lazy", "narrow")}
    assert peaks["narrow"] < peaks["lazy"] - 200 * MiB, {mode: peak // MiB for mode, peak in peaks.items()}


def test_analyze_weights_only_reads_safetensors_layer_by_layer(tmp_path, capsys):
    """``qkov analyze --weights-only`` of a sharded Hugging Face folder opens it lazily (and says
    so), with the results of the model read whole; a pickled state dict is read whole, as the lazy
    reader cannot map it."""
    from qkov.cli import main
    from qkov.interop.lazy import reads_lazily
    from qkov.results import load_results

    folder = saved(tmp_path / "hf", "llama")
    main(["analyze", str(folder), "--weights-only", "--quiet", "--out", str(tmp_path / "out")])
    assert "read layer by layer" in capsys.readouterr().err
    eager = qkov.analyze(qkov.open_model(folder), show_progress=False, weights_only=True)
    written = load_results(tmp_path / "out" / "results.json")
    for step in ("spectra", "copying", "composition"):
        assert_same(getattr(written, step), getattr(eager, step), step)
    pickled = tmp_path / "pickled"  # the same folder with its weights as a pickled state dict
    pickled.mkdir()
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    torch.save(random_hf_model(CASES["llama"]).state_dict(), pickled / "pytorch_model.bin")
    assert reads_lazily(folder) and not reads_lazily(pickled)


def test_analyze_lazy_runs_the_behaviour_steps_layer_by_layer(tmp_path, capsys):
    """``qkov analyze --lazy`` runs the steps with forward passes on the lazy model too (each pass
    reads the layers again), with the results of the model read whole; a folder the lazy reader
    cannot map is one line, before anything is read."""
    from qkov.cli import main
    from qkov.results import load_results

    folder = saved(tmp_path / "hf", "llama")
    steps = "repeated_tokens,term_importance,ablation,neurons"
    main(["analyze", str(folder), "--lazy", "--steps", steps, "--quiet", "--out", str(tmp_path / "out")])
    assert "read layer by layer from the mapped files (--lazy)" in capsys.readouterr().err
    main(["analyze", str(folder), "--steps", steps, "--quiet", "--out", str(tmp_path / "eager")])
    capsys.readouterr()
    lazy, eager = (load_results(tmp_path / out / "results.json") for out in ("out", "eager"))
    assert lazy.repeated_tokens is not None and lazy.neurons is not None
    for step in ("repeated_tokens", "term_importance", "ablation", "neurons"):
        assert_same(getattr(lazy, step), getattr(eager, step), step)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    torch.save(random_hf_model(CASES["llama"]).state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(SystemExit) as stopped:
        main(["analyze", str(pickled), "--lazy", "--out", str(tmp_path / "no")])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("qkov: error: ") and "--lazy reads Hugging Face and qkov safetensors" in err
    assert not (tmp_path / "no").exists()
