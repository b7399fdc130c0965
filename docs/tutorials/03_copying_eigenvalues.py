# %% [markdown]
# # Copying and eigenvalues
#
# Paper, "Copying / Primarily Positive Eigenvalues": a head that copies raises the logit of the
# token it attends to, so its full OV circuit `W_E W_V W_O W_U` (paper `W_U W_OV W_E`) has mostly
# positive eigenvalues. The copying score is `Re(sum l) / sum |l|`, computed in the small space
# (`l(AB) = l(BA)`), never on a vocabulary-by-vocabulary matrix.
#
# The hand-built one-layer model has a copying head (L0H1, OV = +I), an anti-copying head
# (L0H2, OV = -I) and the skip-trigram head L0H0.

# %%
import qkov
from qkov.handbuilt import skip_trigram_model

model = skip_trigram_model([(1, 2, 3), (1, 4, 5)])
full_ov = qkov.full_ov_circuit(model)  # factored: [n_layers, n_heads, d_vocab, d_vocab]
print([round(float(s), 3) for s in qkov.copying_score(full_ov)[0]])

# %% [markdown]
# `copying_analysis` puts every score beside the scores of random matrices of the same shapes
# (the baseline the paper compares with), and shows as the report's figure: eigenvalues per head.

# %%
qkov.copying_analysis(model)

# %% [markdown]
# The direct measures read the logits themselves: each token's effect on its own logit through the
# head (exact here; sampled rows with a Wilson interval for a large vocabulary).

# %%
qkov.direct_copying(model, sample_rows=None)[1]
