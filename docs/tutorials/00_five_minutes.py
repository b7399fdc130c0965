# %% [markdown]
# # Five minutes: from install to an induction head
#
# Install qkov from a clone (CPU is enough for everything on this page):
#
# ```bash
# make setup                       # .venv with CPU torch and qkov (editable, with the test extras)
# .venv/bin/qkov --version
# ```
#
# (A wheel, `python -m build`, installs anywhere with `pip install "dist/qkov-*.whl[serve]"` after
# torch.)
#
# Then train a two-layer attention-only transformer, find its induction head, and look at it. On
# this page the model learns from repeated random tokens (half a minute on a laptop's CPU), where an
# induction head is the only way to predict the repeats; the command line does the same on real
# text (below).
#
# ## Train
#
# A model is a `qkov.Config` and a `qkov.Transformer`, with TransformerLens' weight names and
# shapes (`model.blocks[0].attn.W_Q` is `[n_heads, d_model, d_head]`). Each batch is a random
# sequence repeated: the loss counts the repeats only.

# %%
import torch

import qkov
from qkov.analyze import analyze

torch.manual_seed(0)
cfg = qkov.Config(n_layers=2, n_heads=4, d_model=64, d_head=16, d_vocab=64, n_ctx=32)
model = qkov.Transformer(cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(300):
    period = int(torch.randint(4, 17, ()))  # a period that changes: position alone cannot predict
    tokens = torch.randint(0, cfg.d_vocab, (64, period)).repeat(1, cfg.n_ctx // period + 1)[:, : cfg.n_ctx]
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(
        logits[:, period - 1 : -1].reshape(-1, cfg.d_vocab), tokens[:, period:].reshape(-1)
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss on the repeats after {step + 1} steps: {loss.item():.3f} nats")

# %% [markdown]
# ## Find the induction head
#
# `analyze` runs every analysis of the paper that applies to the model and returns typed results
# (what `qkov analyze` writes to `results.json`). On repeated random tokens, a head whose attention
# goes to the token after the earlier occurrence of the current one scores high on induction; the
# threshold (0.3) is the one the report and the explorer use.

# %%
model.eval()
results = analyze(model, show_progress=False)
repeated = results.repeated_tokens
print("induction heads:", repeated.induction_heads, f"(induction score above {repeated.induction_threshold})")
print("loss on each repeat:", [round(x, 2) for x in repeated.loss_per_repeat])

# %% [markdown]
# ## Look at it
#
# The report's attention viewer, inline: pick an induction head and hover a token of the second
# repeat; each head's pattern is drawn below it, labelled by token, each weight on hover.

# %%
sequence = torch.tensor([7, 21, 3, 40, 12, 9] * 5)
qkov.view.attention(model, sequence, "a six-token sequence repeated")

# %% [markdown]
# Every head's scores in one table (previous-token, induction, duplicate-token, copying), and
# why the induction head works: it composes with a layer-0 head through its keys (K-composition).
# The report draws every composition score on one colour scale, with the random baseline marked.

# %%
qkov.view.heads(model)

# %%
results.composition

# %% [markdown]
# ## The same from the command line, on real text
#
# ```bash
# qkov train --layers 2 --out runs/two     # the Python standard library's source, by default
# qkov analyze runs/two                    # runs/two/results.json and runs/two/report.html
# qkov serve runs/two                      # the explorer: type text, hover tokens, click heads
# ```
#
# `qkov reproduce --quick` runs the whole pipeline (0, 1 and 2 layers, analysis, the paper's claims)
# on tiny models in a minute or two: those are too small to form induction heads; without `--quick`
# it trains the real ones. The next tutorials follow the paper's sections.
