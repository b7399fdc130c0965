"""Checkpoint folders: round trips, hand-written folders, and one clear error per broken file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy
from tokenizers import Tokenizer, models

import qkov
from qkov.checkpoint import expected_shapes

from conftest import random_model

CFG = qkov.Config(n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=30, n_ctx=6)


def write_by_hand(folder, cfg=CFG, tensors=None, config=None):
    """A checkpoint written with numpy and safetensors alone, as a user outside qkov would."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    if tensors is None:
        required, _ = expected_shapes(cfg)
        tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in required.items()}
    save_numpy(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config if config is not None else cfg.to_dict()))
    return tensors


@pytest.mark.parametrize("biases", [False, True])
def test_round_trip_keeps_every_weight_and_the_tokenizer(tmp_path, biases):
    model = random_model(CFG, biases=biases)
    tokenizer = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    qkov.save(model, tmp_path / "ckpt", tokenizer=tokenizer)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    loaded = qkov.load(tmp_path / "ckpt")
    assert loaded.cfg == CFG and loaded.has_biases == biases
    for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.tokenizer.get_vocab() == {"a": 0, "b": 1}
    tokens = torch.randint(0, 30, (2, 6))
    assert torch.equal(model(tokens), loaded(tokens))


def test_a_folder_written_by_hand_loads(tmp_path):
    tensors = write_by_hand(tmp_path)
    model = qkov.load(tmp_path)
    assert model.tokenizer is None and not model.has_biases
    np.testing.assert_array_equal(model.blocks[1].attn.W_O.detach().numpy(), tensors["blocks.1.attn.W_O"])


def test_some_biases_present_the_rest_are_zero(tmp_path):
    required, _ = expected_shapes(CFG)
    tensors = {n: np.ones(s, dtype=np.float32) for n, s in required.items()}
    tensors["b_U"] = np.full(30, 2.0, dtype=np.float32)
    write_by_hand(tmp_path, tensors=tensors)
    model = qkov.load(tmp_path)
    assert model.has_biases
    assert torch.all(model.b_U == 2.0) and torch.all(model.blocks[0].attn.b_Q == 0)


def test_float64_checkpoint_loads_as_float64(tmp_path):
    required, _ = expected_shapes(CFG)
    write_by_hand(tmp_path, tensors={n: np.ones(s) for n, s in required.items()})
    assert qkov.load(tmp_path).W_E.dtype == torch.float64


def test_save_leaves_no_temporary_files_and_overwrites_atomically(tmp_path):
    model = random_model(CFG)
    qkov.save(model, tmp_path)
    qkov.save(random_model(CFG, seed=1), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(qkov.load(tmp_path).W_E, random_model(CFG, seed=1).W_E)


def broken(name):
    """Each broken checkpoint: (how to break it, what the error must say)."""
    required, _ = expected_shapes(CFG)

    def tensors_without(key):
        t = {n: np.zeros(s, dtype=np.float32) for n, s in required.items()}
        del t[key]
        return t

    def tensors_with(key, value):
        t = {n: np.zeros(s, dtype=np.float32) for n, s in required.items()}
        t[key] = value
        return t

    return {
        "missing": (
            lambda f: write_by_hand(f, tensors=tensors_without("blocks.1.attn.W_K")),
            "missing tensor blocks.1.attn.W_K",
        ),
        "unexpected": (
            lambda f: write_by_hand(
                f, tensors=tensors_with("blocks.2.attn.W_Q", np.zeros((2, 8, 4), dtype=np.float32))
            ),
            "unexpected tensor blocks.2.attn.W_Q",
        ),
        "shape": (
            lambda f: write_by_hand(f, tensors=tensors_with("W_U", np.zeros((8, 31), dtype=np.float32))),
            r"tensor W_U has shape \(8, 31\), config expects \(8, 30\)",
        ),
        "nan": (
            lambda f: write_by_hand(
                f, tensors=tensors_with("blocks.0.attn.W_V", np.full((2, 8, 4), np.nan, dtype=np.float32))
            ),
            "tensor blocks.0.attn.W_V has non-finite values",
        ),
        "inf": (
            lambda f: write_by_hand(
                f, tensors=tensors_with("W_pos", np.full((6, 8), np.inf, dtype=np.float32))
            ),
            "tensor W_pos has non-finite values",
        ),
        "integer": (
            lambda f: write_by_hand(f, tensors=tensors_with("W_E", np.zeros((30, 8), dtype=np.int32))),
            "tensor W_E has dtype",
        ),
        "truncated": (
            lambda f: (write_by_hand(f), truncate(f / "model.safetensors")),
            "truncated or corrupt",
        ),
        "corrupt": (
            lambda f: (write_by_hand(f), (f / "model.safetensors").write_bytes(b"\xff" * 64)),
            "truncated or corrupt",
        ),
        "no weights": (
            lambda f: (write_by_hand(f), (f / "model.safetensors").unlink()),
            "model.safetensors: missing",
        ),
        "bad json": (
            lambda f: (write_by_hand(f), (f / "config.json").write_text("{n_layers: 2")),
            "not valid JSON",
        ),
        "config field": (lambda f: write_by_hand(f, config=CFG.to_dict() | {"d_ff": 4}), "unknown field"),
        "config value": (
            lambda f: write_by_hand(f, config=CFG.to_dict() | {"n_heads": -1}),
            "n_heads must be a positive integer",
        ),
        "no config": (lambda f: (write_by_hand(f), (f / "config.json").unlink()), "no config.json"),
        "tokenizer too big": (
            lambda f: (
                write_by_hand(f),
                (f / "tokenizer.json").write_text(
                    Tokenizer(models.BPE(vocab={str(i): i for i in range(31)}, merges=[])).to_str()
                ),
            ),
            "tokenizer has 31 tokens, more than the model's d_vocab=30",
        ),
        "tokenizer corrupt": (
            lambda f: (write_by_hand(f), (f / "tokenizer.json").write_text("{}")),
            "not a valid tokenizer",
        ),
    }[name]


def truncate(file):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


BROKEN = [
    "missing",
    "unexpected",
    "shape",
    "nan",
    "inf",
    "integer",
    "truncated",
    "corrupt",
    "no weights",
    "bad json",
    "config field",
    "config value",
    "no config",
    "tokenizer too big",
    "tokenizer corrupt",
]


@pytest.mark.parametrize("name", BROKEN)
def test_broken_checkpoint_gives_one_clear_error(tmp_path, name):
    make, message = broken(name)
    make(tmp_path)
    with pytest.raises(qkov.QkovError, match=message) as info:
        qkov.load(tmp_path)
    assert "\n" not in str(info.value)


def test_loading_a_folder_that_does_not_exist(tmp_path):
    with pytest.raises(qkov.QkovError, match="no such checkpoint folder"):
        qkov.load(tmp_path / "nope")


def test_a_config_from_before_layer_norm_and_mlps_loads_as_attention_only(tmp_path):
    old = {
        k: v
        for k, v in CFG.to_dict().items()
        if k not in ("normalization", "d_mlp", "act_fn", "ln_eps", "source", "d_vocab_out", "bos_token_id")
    }
    assert len(old) == 7
    write_by_hand(tmp_path, config=old)
    model = qkov.load(tmp_path)
    assert model.cfg == CFG and model.cfg.source == "qkov" and model.ln_final is None
    assert all(block.mlp is None and block.ln1 is None for block in model.blocks)


@pytest.mark.parametrize("normalization", ["LN", "LNPre"])
def test_a_layer_norm_mlp_checkpoint_round_trips_and_names_a_missing_norm(tmp_path, normalization):
    cfg = qkov.Config(
        **(CFG.to_dict() | {"normalization": normalization, "d_mlp": 12, "positional_embedding": "standard"})
    )
    model = random_model(cfg, biases=True)
    qkov.save(model, tmp_path / "ckpt")
    loaded = qkov.load(tmp_path / "ckpt")
    tokens = torch.randint(0, 30, (2, 6))
    assert torch.equal(model(tokens), loaded(tokens))
    if normalization == "LN":
        required, _ = expected_shapes(cfg)
        tensors = {n: np.ones(s, dtype=np.float32) for n, s in required.items() if n != "blocks.1.ln2.b"}
        write_by_hand(tmp_path / "broken", cfg, tensors=tensors)
        with pytest.raises(qkov.QkovError, match="missing tensor blocks.1.ln2.b"):
            qkov.load(tmp_path / "broken")


def test_flipped_bytes_in_saved_weights_are_refused_not_loaded(tmp_path):
    """safetensors has no checksum: qkov writes one of the tensors beside them and checks it on load,
    so a damaged file is one line, never a different model; a file without one is read as it is."""
    from safetensors.torch import save_file

    model = qkov.AttnOnlyTransformer(qkov.Config(1, 2, 8, 4, 20, 8))
    folder = qkov.save(model, tmp_path / "c")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    for offset in range(len(data) - 200, len(data) - 100):  # inside the tensors, past the header
        data[offset] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(qkov.QkovError, match="checksum"):
        qkov.load(folder)
    save_file({n: p.detach() for n, p in model.named_parameters()}, str(weights))  # another writer's file
    assert torch.equal(qkov.load(folder).W_E, model.W_E)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_half_precision_and_float8_weights_load_and_compute_in_float32(tmp_path, dtype):
    """A checkpoint saved in bfloat16, float16 or float8 loads (float8 crashed ``info``, half precision
    ``analyze``: no QR kernel) as a float32 model holding exactly the stored values."""
    from safetensors.torch import save_file

    model = qkov.AttnOnlyTransformer(qkov.Config(1, 2, 8, 4, 20, 8))
    folder = qkov.save(model, tmp_path / "c")
    stored = {n: p.detach().to(dtype) for n, p in model.named_parameters()}
    save_file(stored, str(folder / "model.safetensors"))
    loaded = qkov.load(folder)
    assert loaded.W_E.dtype == torch.float32 and torch.equal(loaded.W_E, stored["W_E"].float())
    assert qkov.copying_analysis(loaded).heads  # eigenvalues: float32 kernels


def test_a_file_of_the_folder_means_the_folder(tmp_path):
    model = random_model(qkov.Config(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=11, n_ctx=6))
    qkov.save(model, tmp_path / "ckpt")
    for name in ("model.safetensors", "config.json"):
        loaded = qkov.load(tmp_path / "ckpt" / name)
        assert torch.equal(loaded.W_E, model.W_E)
    with pytest.raises(qkov.QkovError, match="no such checkpoint folder"):
        qkov.load(tmp_path / "ckpt" / "absent.safetensors")
