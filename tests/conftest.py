"""Shared fixtures: tiny models, a tiny corpus, and an isolated token cache for every test."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

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
