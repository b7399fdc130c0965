# %% [markdown]
# # Frozen attention, path expansion and term importance
#
# Paper, "Path Expansion of Logits" and "Term Importance Analysis": with the attention patterns
# frozen, every head is linear, and the logits are exactly a sum over paths: the direct path, one
# term per head, one per pair of heads in increasing layers (virtual heads), and so on.

# %%
import torch

import qkov
from qkov.handbuilt import induction_model

model = induction_model(d_vocab=16, n_ctx=12)
tokens = torch.tensor([[3, 5, 7, 9] * 3])
terms = qkov.path_expansion(model, tokens)
terms  # the size of each path's term

# %% [markdown]
# The terms sum to the model's logits (to float rounding):

# %%
print(f"max |sum of terms - logits| = {float((sum(terms.values()) - model(tokens)).abs().max()):.2e}")

# %% [markdown]
# Term importance: the loss with the paths up to each order kept. For this model the induction
# head's first-order term does the work.

# %%
qkov.term_importance(model, tokens)
