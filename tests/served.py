"""What the explorer's tests share: a checkpoint whose answers are known (the hand-built induction model
with a vocabulary of words and hostile strings), the app serving it, a GET that follows jobs, and a
GPT-2-style float64 model with LayerNorm unfolded and what its weights read through LayerNorm."""

from __future__ import annotations

import time

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

import qkov

from conftest import random_model, small_config
from handbuilt import induction_model

EVIL = ["<script>alert(1)</script>", "<img/src=x/onerror=alert(1)>", "</script>"]


WORDS = [
    *("cat", "sat", "on", "the", "mat", ".", "dog", "ran", "to", "a", "park", "and", "then", "it"),
    *("came", "back", "home", ",", "big", "red", "blue", "green", "small"),
]


TEXT = "cat sat on the mat . dog ran cat sat on"
ROWS = [  # the user's data for the explorer's checkpoint: hostile tokens among words, repeats to induce
    f"cat sat on the mat {EVIL[0]} dog ran cat sat on",
    f"dog ran to a park {EVIL[1]} and then dog ran to",
    "big red cat sat on the mat . big red cat",
]
UNTARGETED = (3, 7)  # positions of row 1 given no target (-100)


def word_tokenizer(words: list[str]) -> Tokenizer:
    """One token per whitespace-separated word (id 0 is the unknown word)."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def explorer_checkpoint(folder):
    """The hand-built induction model (L0H0 previous-token, L1H0 induction) with a vocabulary of
    words and hostile strings: a checkpoint folder whose right answers are known."""
    vocab = ["[UNK]", *EVIL, *WORDS]
    model = induction_model(d_vocab=len(vocab), n_ctx=24)
    return qkov.save(model, folder, word_tokenizer(vocab)), model


def word_data(folder, model) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``ROWS`` as the user's files ``folder/rows.npy`` and ``folder/targets.pt``: next-token
    targets, none (-100) at ``UNTARGETED`` in row 1. The tokens, the targets, and the command
    line's options naming the files."""
    tokens = torch.tensor([model.tokenizer.encode(row).ids for row in ROWS])
    targets = torch.full_like(tokens, -100)
    targets[:, :-1] = tokens[:, 1:]
    targets[1, list(UNTARGETED)] = -100
    np.save(folder / "rows.npy", tokens.numpy())
    torch.save(targets, folder / "targets.pt")
    return tokens, targets, ["--tokens", str(folder / "rows.npy"), "--targets", str(folder / "targets.pt")]


def get(client, url, **params):
    """GET, following a job (202) to its answer."""
    response = client.get(url, params=params)
    while response.status_code == 202:
        time.sleep(0.05)
        response = client.get(f"/api/jobs/{response.json()['job']}")
    assert response.status_code == 200, response.text
    return response.json()


def ids_of(model, text):
    return model.tokenizer.encode(text).ids


def layer_norm_model() -> qkov.AttnOnlyTransformer:
    """A GPT-2-style model as ``qkov import --no-fold`` keeps one: LayerNorm unfolded
    (``normalization="LN"``), its weight near 1 and its bias drawn (folding them is not trivial),
    biases everywhere, float64 so that the dense reference is exact."""
    model = random_model(
        small_config(positional_embedding="standard", normalization="LN"), seed=7, biases=True
    )
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=gen))
    return model.double().requires_grad_(False)


def layer_norm_read(x: torch.Tensor, ln) -> torch.Tensor:
    """What a weight after LayerNorm reads of ``x`` (the linear part, per unit scale): ``x``
    centred over ``d_model``, times LayerNorm's weight (its bias and scale reach no circuit)."""
    return (x - x.mean(-1, keepdim=True)) * ln.w
