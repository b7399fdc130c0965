# %% [markdown]
# # Composition and induction heads
#
# Paper, "Two-Layer Attention-Only Transformers": heads of layer 1 read what layer-0 heads wrote.
# An induction head attends to the token after an earlier occurrence of the current token, found
# by K-composition with a previous-token head: its keys read `W_O` of the previous-token head.
#
# `qkov.handbuilt.induction_model` builds exactly that: L0H0 a previous-token head, L1H0 an
# induction head by K-composition. The report's attention viewer works in the notebook: pick L1H0
# and hover a repeated token.

# %%
import torch

import qkov
from qkov.handbuilt import induction_model

model = induction_model(d_vocab=16, n_ctx=12)
tokens = torch.tensor([3, 5, 7, 9] * 3)
qkov.view.attention(model, tokens, "a repeated sequence")

# %% [markdown]
# Every head's scores, as the report and the explorer show them (computed by `qkov analyze`'s own
# steps on its seeded repeated random tokens): L1H0 sits in the induction corner.

# %%
qkov.view.heads(model)

# %% [markdown]
# Composition scores: `||W_QK^T W_OV|| / (||W_QK|| ||W_OV||)` in the paper's form, baseline
# subtracted as in the paper (TransformerLens reports the raw score).

# %%
from qkov.analyze import run_steps

run_steps(model, ["composition"])["composition"]

# %%
k = qkov.composition_scores(model, "K")  # [layer_from, head_from, layer_to, head_to]
print(f"K-composition L0H0 -> L1H0: {float(k[0, 0, 1, 0]):+.3f}")
