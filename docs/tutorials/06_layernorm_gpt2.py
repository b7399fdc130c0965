# %% [markdown]
# # LayerNorm folding and GPT-2-style imports
#
# Paper, appendix "Handling Layer Normalization": LayerNorm's weight and bias fold into the
# following weights, leaving centring and a per-position scale (TransformerLens' `LNPre`). qkov
# imports GPT-2-style models from Hugging Face and TransformerLens and folds them by default. Here a
# randomly initialised GPT-2 of tiny shapes (nothing downloaded) comes in through `qkov.from_hf`.

# %%
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import qkov

torch.manual_seed(0)
hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)).eval()
model = qkov.from_hf(hf)  # folded: normalization LNPre, MLPs kept
model

# %% [markdown]
# The folded model computes the same logits as the original:

# %%
tokens = torch.randint(0, 64, (2, 16))
with torch.no_grad():
    gap = (model(tokens).log_softmax(-1) - hf(tokens).logits.log_softmax(-1)).abs().max()
print(f"largest log-probability difference {float(gap):.1e}")

# %% [markdown]
# Path expansion stays exact with LayerNorm and MLPs: each position's LayerNorm scale and each MLP's
# write are frozen like the patterns (MLP paths are named `L0MLP`, ...; biases gather in `bias`).

# %%
terms = qkov.path_expansion(model, tokens, by="order")
print(f"max |sum - logits| = {float((sum(terms.values()) - model(tokens)).abs().max()):.1e}")
terms
