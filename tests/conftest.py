"""Shared fixtures: tiny models, a tiny corpus, and an isolated token cache for every test."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

import qkov

# CI replays the same examples every run (no flaky failures from a lucky draw); a developer's run
# explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QKOV_CACHE", str(tmp_path_factory.mktemp("qkov-cache")))


def random_model(
    cfg: qkov.Config, seed: int = 0, biases: bool = False, scale: float = 1.0
) -> qkov.AttnOnlyTransformer:
    """A model with every weight (biases included) drawn at random, so nothing is trivially zero."""
    model = qkov.AttnOnlyTransformer(cfg, biases=biases)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * scale / param.shape[-1] ** 0.25)
    return model


CLASSIFIER = qkov.Config(
    n_layers=2, n_heads=2, d_model=12, d_head=4, d_vocab=9, n_ctx=7, positional_embedding="standard",
    normalization="LN", d_vocab_out=2,
)  # a classifier: 2 outputs for 9 input tokens  # fmt: skip


def classifier_data(batch: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of ids and a label at the last position only (-100 elsewhere)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 9, (batch, 7), generator=gen)
    targets = torch.full_like(tokens, -100)
    targets[:, -1] = torch.randint(0, 2, (batch,), generator=gen)
    return tokens, targets


def write_tiny_corpus(folder, functions: int = 40):
    """A small folder of real-looking Python source."""
    folder.mkdir()
    for i in range(12):
        body = "".join(
            f"def function_{i}_{j}(self, value):\n    return self.value_{j} + value * {i}\n\n"
            for j in range(functions)
        )
        (folder / f"module_{i}.py").write_text(f"import os\n\nclass Thing{i}:\n" + body)
    return folder


@pytest.fixture
def tiny_corpus(tmp_path):
    return write_tiny_corpus(tmp_path / "corpus")


def small_config(n_layers=2, positional_embedding="shortformer", **kw):
    base = dict(n_layers=n_layers, n_heads=3, d_model=16, d_head=4, d_vocab=23, n_ctx=10)
    return qkov.Config(positional_embedding=positional_embedding, **(base | kw))


def float64_model(n_layers=2, positional_embedding="shortformer", biases=False, seed=0, **kw):
    return random_model(small_config(n_layers, positional_embedding, **kw), seed=seed, biases=biases).double()


def tokens_for(model, batch=3, pos=None, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.d_vocab, (batch, pos or model.cfg.n_ctx), generator=gen)


@st.composite
def small_float64_models(draw):
    """Random float64 models of small shapes for the algebra's property tests: ``d_head > d_vocab``
    and ``d_model > d_vocab`` included, and the first head generic, zero (``W_O = W_K = 0``) or
    rank-one (``W_V`` and ``W_Q`` of rank one)."""
    cfg = qkov.Config(
        n_layers=draw(st.integers(1, 2)),
        n_heads=draw(st.integers(1, 2)),
        d_model=draw(st.integers(1, 8)),
        d_head=draw(st.integers(1, 9)),
        d_vocab=draw(st.integers(2, 12)),
        n_ctx=4,
        positional_embedding="none",
    )
    model = random_model(cfg, seed=draw(st.integers(0, 2**31 - 1))).double()
    with torch.no_grad():
        attn = model.blocks[0].attn
        kind = draw(st.sampled_from(["generic", "zero", "rank-one"]))
        if kind == "zero":
            attn.W_O[0] = 0.0
            attn.W_K[0] = 0.0
        elif kind == "rank-one":
            attn.W_V[0] = attn.W_V[0, :, :1] * torch.ones(cfg.d_head)
            attn.W_Q[0] = attn.W_Q[0, :, :1] * torch.ones(cfg.d_head)
    return model


@pytest.fixture(scope="module")
def induction():
    """The hand-built induction model at 16 tokens and a context of 12, for the inline views."""
    from handbuilt import induction_model

    return induction_model(d_vocab=16, n_ctx=12)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The explorer of served.explorer_checkpoint, and the model it serves."""
    from fastapi.testclient import TestClient

    from qkov.serve import build_app

    from served import explorer_checkpoint

    folder, model = explorer_checkpoint(tmp_path_factory.mktemp("serve") / "induction")
    app, jobs = build_app(folder)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, qkov.load(folder).requires_grad_(False)
    jobs.shutdown()


@pytest.fixture(scope="module")
def reports():
    """The hand-built models with synthetic training logs: the 2-layer one with a phase change around
    10M tokens, and (as reproduce does) the 1-layer control in its phase change."""
    import dataclasses

    from qkov.analyze import analyze
    from qkov.circuits.phase_change import phase_change
    from qkov.results import Claim

    from handbuilt import induction_model, skip_trigram_model
    from pages import EVIL, evil_tokens
    from phase_logs import ONE_LAYER_LINEAR, two_layer, with_positions

    torch.manual_seed(0)
    models = {"1-layer": skip_trigram_model([(5, 3, 9), (5, 4, 10)]), "2-layer": induction_model()}
    logs = {"1-layer": with_positions(ONE_LAYER_LINEAR), "2-layer": with_positions(two_layer())}
    results = {}
    for name, model in models.items():  # untrusted token strings everywhere a token is shown
        model.tokenizer = evil_tokens(model)
        results[name] = analyze(model, None, logs[name], show_progress=False)
    change = phase_change(logs["2-layer"], logs["1-layer"])
    results["2-layer"] = dataclasses.replace(results["2-layer"], phase_change=change)
    claims = [Claim(EVIL[0], "p", EVIL[1], EVIL[2], "holds", note=EVIL[1])]
    return results, claims
