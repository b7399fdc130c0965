"""Weights in no known layout, by a key mapping: a plain PyTorch model (token embedding, a fixed
sinusoidal position buffer, a fused W_qkv nn.Linear split head-major into q, k, v, W_o, an
unembedding; no LayerNorm, no biases) imports through a JSON mapping and computes its own forward's
log-probabilities to float64 precision; the README's "Bring your own model" section runs as shown."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
from torch import nn

import qkov
from qkov.cli import main
from qkov.interop import log_prob_difference

D_VOCAB, D_MODEL, N_HEADS, D_HEAD, N_CTX = 256, 64, 4, 16, 80


def sinusoids(n_ctx, d_model):
    pos = torch.arange(n_ctx)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2) / d_model)
    table = torch.zeros(n_ctx, d_model)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table


class PlainAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.W_qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.W_o = nn.Linear(D_MODEL, D_MODEL, bias=False)

    def forward(self, x):
        batch, pos, _ = x.shape
        q, k, v = self.W_qkv(x).split(D_MODEL, dim=-1)  # each head-major: (n_heads d_head)
        q, k, v = (t.view(batch, pos, N_HEADS, D_HEAD).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D_HEAD)
        causal = torch.ones(pos, pos, dtype=torch.bool).tril()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.W_o((pattern @ v).transpose(1, 2).reshape(batch, pos, D_MODEL))


class PlainModel(nn.Module):
    """A plain PyTorch attention-only model in its own layout (nothing from qkov)."""

    def __init__(self, n_layers=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.token_embedding = nn.Embedding(D_VOCAB, D_MODEL)
        self.register_buffer("position_embedding", sinusoids(N_CTX, D_MODEL))
        self.attention_blocks = nn.ModuleList(PlainAttention() for _ in range(n_layers))
        self.unembed = nn.Linear(D_MODEL, D_VOCAB, bias=False)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding[: tokens.shape[1]]
        for block in self.attention_blocks:
            x = x + block(x)
        return self.unembed(x)


def readme_section():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    return text.split("## Bring your own model", 1)[1].split("\n## ", 1)[0]


def readme_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", readme_section(), flags=re.S)


def mapping():
    return json.loads(readme_blocks("json")[0])


def test_the_readme_example_runs_as_shown(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "map.json").write_text(readme_blocks("json")[0])
    my_model = PlainModel().eval()
    namespace = {"my_model": my_model}
    exec(readme_blocks("python")[0], namespace)  # saves my_model.pt and reference.safetensors, imports
    printed = capsys.readouterr().out
    match = re.search(r"difference against the given forward: (\S+) \(4 x 80 tokens", printed)
    assert match and float(match[1]) < 1e-5, printed  # float32 weights
    assert isinstance(namespace["model"], qkov.Transformer)
    commands = [line for line in readme_blocks("bash")[0].splitlines() if line.startswith("qkov ")]
    assert commands
    for command in commands:
        main(shlex.split(command)[1:])
    err = capsys.readouterr().err
    assert re.search(r"against reference.safetensors: \S+ \(4 x 80 tokens\)", err), err
    tokens = torch.randint(0, D_VOCAB, (2, N_CTX), generator=torch.Generator().manual_seed(9))
    difference = log_prob_difference(qkov.load(tmp_path / "my-qkov"), tokens, my_model(tokens).detach())
    assert difference < 1e-5


@pytest.mark.parametrize("fold", [False, True])
def test_mapped_log_probs_equal_the_models_own_forward_in_float64(fold, capsys):
    plain = PlainModel().double().eval()
    model = qkov.from_weights(plain.state_dict(), mapping(), fold=fold, forward=plain, tolerance=1e-12)
    assert "against the given forward" in capsys.readouterr().out
    tokens = torch.randint(0, D_VOCAB, (3, N_CTX), generator=torch.Generator().manual_seed(2))
    ours = model(tokens).log_softmax(-1)
    theirs = plain(tokens).detach().log_softmax(-1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert model.W_E.dtype == torch.float64 and model.cfg.positional_embedding == "standard"
    torch.testing.assert_close(model.W_pos, plain.position_embedding, rtol=0, atol=0)
    # the heads are the model's own: head 1's query weights are rows 16..31 of W_qkv, transposed
    W_qkv = plain.attention_blocks[0].W_qkv.weight
    torch.testing.assert_close(model.blocks[0].attn.W_Q[1], W_qkv[16:32].T, rtol=0, atol=0)
    torch.testing.assert_close(model.blocks[0].attn.W_K[1], W_qkv[80:96].T, rtol=0, atol=0)


def test_a_wrong_mapping_is_caught_by_the_forward(tmp_path):
    plain = PlainModel().double().eval()
    wrong = mapping()
    wrong["tensors"]["blocks.{layer}.attn.W_Q"]["index"] = 1  # queries read the keys' rows
    with pytest.raises(qkov.QkovError, match=r"the imported model disagrees: largest log-probability"):
        qkov.from_weights(plain.state_dict(), wrong, forward=plain)


def edit(change):
    data = mapping()
    change(data)
    return data


def set_in(data, path, value):
    *parents, last = path
    for key in parents:
        data = data[key]
    if value == "DROP":
        del data[last]
    else:
        data[last] = value


BAD = {
    "unknown key": (("tensor",), {}, r"unknown key\(s\) tensor \(a mapping has config, tensors"),
    "unknown config key": (("config", "n_kv_heads"), 2, r"config: unknown field\(s\) n_kv_heads"),
    "unknown spec key": (("tensors", "W_U", "transpose"), True, r"tensors.W_U: unknown key\(s\) transpose"),
    "unmapped tensor": (("tensors", "W_pos"), "DROP", "tensor position_embedding is not mapped"),
    "missing tensor": (
        ("tensors", "W_E"), "embedding.weight", r"missing tensor embedding.weight \(the mapping reads"
    ),
    "pattern does not fit": (
        ("config", "d_head"), 12, r"attention_blocks.0.W_qkv.weight has shape \(192, 64\), which does not fit"
    ),
    "wrong qkov shape": (
        ("tensors", "W_U"), "unembed.weight", r"tensor W_U has shape \(256, 64\), config expects \(64, 256\)"
    ),
    "no layers in the name": (
        ("tensors", "W_E"), "attention_blocks.{layer}.W_o.weight", "has no {layer}"
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_mapping_gives_one_line(tmp_path, capsys, kind):
    path, value, message = BAD[kind]
    torch.save(PlainModel().state_dict(), tmp_path / "my_model.pt")
    (tmp_path / "map.json").write_text(json.dumps(edit(lambda data: set_in(data, path, value))))
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(tmp_path / "my_model.pt"), "--mapping", str(tmp_path / "map.json"),
              "--out", str(tmp_path / "out")])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkov: error: ") and "\n" not in err and re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_mapping_says_the_attention_is_bidirectional():
    """A mapping's config takes every qkov field: a bidirectional model (a classifier reading the
    whole sequence) no longer imports silently as causal, and its forward then differs from the
    causal one's by order one, which the agreement check would catch."""
    plain = PlainModel().double().eval()
    spec = mapping()
    spec["config"]["attention_dir"] = "bidirectional"
    model = qkov.from_weights(plain.state_dict(), spec)
    assert model.cfg.attention_dir == "bidirectional"
    tokens = torch.randint(0, D_VOCAB, (2, N_CTX), generator=torch.Generator().manual_seed(3))
    assert log_prob_difference(model, tokens, plain(tokens).detach()) > 1e-3
