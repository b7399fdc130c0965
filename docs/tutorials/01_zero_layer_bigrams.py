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
from qkov.data.shards import corpus_tokens
from qkov.reproduce import quick_recipe
from qkov.training_run import TrainingRun, settings_of, train

recipe = quick_recipe(0)  # what `qkov reproduce --quick` trains: seconds, no phenomena promised
run = TrainingRun(Path("../_build/models/0-layer"), 0, settings=settings_of(recipe), resume=True)
model = train(run, show_progress=False)  # the default corpus: the standard library's source
data = corpus_tokens(None, model.tokenizer)  # the tokens it trained on, from the cache
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
