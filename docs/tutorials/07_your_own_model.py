# %% [markdown]
# # Bringing your own model
#
# Weights in a layout qkov does not know come in through a mapping: for each qkov tensor
# (TransformerLens' names, `{layer}` for every layer) the tensor of yours it is, rearranged by an
# einops pattern. Given your model's forward, `qkov.from_weights` checks that the logits agree and
# refuses a model that differs (a wrong orientation or head order is caught, not analysed).
#
# Here: a plain PyTorch attention-only model with a fused `W_qkv` in `nn.Linear` orientation.

# %%
import math

import torch
from torch import nn

import qkov

D_MODEL, N_HEADS, D_HEAD, D_VOCAB, N_CTX = 32, 2, 16, 50, 20


class PlainAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.W_qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.W_o = nn.Linear(D_MODEL, D_MODEL, bias=False)

    def forward(self, x):
        batch, pos, _ = x.shape
        q, k, v = self.W_qkv(x).split(D_MODEL, dim=-1)
        q, k, v = (t.view(batch, pos, N_HEADS, D_HEAD).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D_HEAD)
        causal = torch.ones(pos, pos, dtype=torch.bool).tril()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.W_o((pattern @ v).transpose(1, 2).reshape(batch, pos, D_MODEL))


class PlainModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.token_embedding = nn.Embedding(D_VOCAB, D_MODEL)
        self.position_embedding = nn.Parameter(torch.randn(N_CTX, D_MODEL) * 0.1)
        self.blocks = nn.ModuleList(PlainAttention() for _ in range(2))
        self.unembed = nn.Linear(D_MODEL, D_VOCAB, bias=False)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding[: tokens.shape[1]]
        for block in self.blocks:
            x = x + block(x)
        return self.unembed(x)


mine = PlainModel().eval()

# %%
fused = {"from": "blocks.{layer}.W_qkv.weight", "rearrange": "(qkv n_heads d_head) d_model -> qkv n_heads d_model d_head",
         "sizes": {"qkv": 3}}  # fmt: skip
mapping = {
    "config": {"n_layers": 2, "n_heads": N_HEADS, "d_model": D_MODEL, "d_head": D_HEAD, "d_vocab": D_VOCAB,
               "n_ctx": N_CTX, "positional_embedding": "standard"},
    "tensors": {
        "W_E": "token_embedding.weight",
        "W_pos": "position_embedding",
        "blocks.{layer}.attn.W_Q": fused | {"index": 0},
        "blocks.{layer}.attn.W_K": fused | {"index": 1},
        "blocks.{layer}.attn.W_V": fused | {"index": 2},
        "blocks.{layer}.attn.W_O": {"from": "blocks.{layer}.W_o.weight",
                                    "rearrange": "d_model (n_heads d_head) -> n_heads d_head d_model"},
        "W_U": {"from": "unembed.weight", "rearrange": "d_vocab d_model -> d_model d_vocab"},
    },
    "ignore": [],
}  # fmt: skip
model = qkov.from_weights(mine.state_dict(), mapping, forward=mine)  # prints the agreement
model

# %% [markdown]
# From here every analysis and view applies, for instance the attention viewer on some tokens:

# %%
qkov.view.attention(model, torch.arange(12), "the token ids 0-11")
