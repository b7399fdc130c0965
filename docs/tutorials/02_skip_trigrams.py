# %% [markdown]
# # One layer: skip-trigrams and their bugs
#
# Paper, "One-Layer Attention-Only Transformers": a head reads as skip-trigrams
# `[source] ... [destination] -> [out]`: its QK circuit (`W_E W_Q W_K^T W_E^T`, paper
# `W_E^T W_QK W_E`) makes a destination attend to a source, its OV circuit (`W_E W_V W_O W_U`, paper
# `W_U W_OV W_E`) maps the source to an out. Because both factor through the source, two strong
# skip-trigrams sharing a source force the crossed ones: "keep ... in mind" and "keep ... at bay"
# force "keep ... in bay".
#
# `qkov.handbuilt.skip_trigram_model` plants skip-trigrams in head 0 of a one-layer model, so we know
# the answer: source 1 with destinations 2 and 4 going to outs 3 and 5.

# %%
import qkov
from qkov.analyze import run_steps
from qkov.handbuilt import skip_trigram_model

model = skip_trigram_model([(1, 2, 3), (1, 4, 5)])
trigrams = run_steps(model, ["skip_trigrams"])["skip_trigrams"]  # analyze's own step
trigrams

# %% [markdown]
# Shown alone, a result knows token ids only (`#id`); inside `Results` it uses the tokenizer's
# strings. The bug: `#1 ... #2 -> #5` and `#1 ... #4 -> #3` are forced, though never planted.

# %%
bug = trigrams.bugs["L0H0"][0]
print("strong:", bug.first, bug.second, "forced:", [(c.destination, c.out) for c in bug.crossed])
