# %% [markdown]
# # The explorer, and views you can keep
#
# `qkov serve CHECKPOINT` opens a local explorer in the browser: type text and hover tokens to see
# where each head attends, read a head's OV and QK rows over the whole vocabulary, its skip-trigrams,
# the path expansion at a position, and every head's scores. In a notebook, the same views come
# from `qkov.view`, with no server: each output is self-contained (no network, no widgets), so it
# works in Jupyter, VS Code and Colab, and in a notebook saved as HTML.
#
# A checkpoint for the explorer is a folder (`config.json`, `model.safetensors`, optional
# `tokenizer.json`):

# %%
from pathlib import Path

import torch

import qkov
from qkov.handbuilt import induction_model

model = induction_model(d_vocab=16, n_ctx=12)
folder = Path("../_build/models/induction")
qkov.save(model, folder)
print(f"qkov serve {folder}")  # run in a terminal; it prints the address to open
qkov.load(folder)

# %% [markdown]
# Every head's scores, as the explorer's heads table computes them (`qkov analyze`'s own steps):

# %%
heads = qkov.view.heads(model)
heads

# %% [markdown]
# Any view saves as one HTML file that opens offline, hover included:

# %%
view = qkov.view.attention(model, torch.tensor([3, 5, 7, 9] * 3), "a repeated sequence")
print(view.save("../_build/views/attention.html"), heads.save("../_build/views/heads.html"))
view
