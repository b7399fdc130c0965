# %% [markdown]
# # Zero layers: the direct path is a bigram table
#
# Paper, "Zero-Layer Transformers": with no attention, the logits are `x W_E W_U` (row vectors;
# the paper writes `W_U W_E`), one row per current token, so the model can only learn bigram
# statistics: `log P(next | current)`. Here we train qkov's quick 0-layer model on the default corpus
# (the Python standard library's source, found on this machine) and compare its direct path with
# the corpus' bigram table.

# %%
from pathlib import Path

import qkov
from qkov.analyze import analyze
from qkov.data.corpus import read_corpus
from qkov.data.tokens import cached_tokenizer, cached_tokens
from qkov.reproduce import quick_recipe, train_depth

text = read_corpus(None)  # the default corpus
recipe = quick_recipe(0)  # what `qkov reproduce --quick` trains: seconds, no phenomena promised
tokenizer = cached_tokenizer(text, recipe.vocab_size)
data = cached_tokens(text, tokenizer)
model = train_depth(0, recipe, data, tokenizer, Path("../_build/models/0-layer"), 0, False, "cpu")
model  # a model shows its settings and weights

# %% [markdown]
# `analyze` runs every analysis that applies; for a 0-layer model with a corpus that is the bigram
# comparison. A result shows as the report's section for it.

# %%
results = analyze(model, data, show_progress=False)
results.bigram

# %% [markdown]
# The correlation is that of `log P(next | current)` between `W_E W_U` and the corpus over the most
# common tokens. A model trained this briefly is far from the bigram optimum; `qkov reproduce`
# (1000 steps) reaches 0.75 (see [the claims](../claims.md)).

# %%
print(f"correlation {results.bigram.correlation:.3f}, KL {results.bigram.kl:.3f} nats")
