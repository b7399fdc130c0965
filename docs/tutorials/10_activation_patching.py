# %% [markdown]
# # Activation patching, as ARENA does it
#
# Activation patching asks where in the model a difference between two inputs is carried: run a
# *clean* input and a *corrupted* one, then rerun the corrupted input with one activation taken
# from the clean run, and see how much of the clean behaviour comes back. ARENA's TransformerLens
# notebooks do it with `run_with_cache` and `run_with_hooks`; qkov's model takes the same calls,
# the same hook names and the same hook functions (`fn(activation, hook)` returning a replacement,
# or changing the activation in place). This page does it on a two-layer model trained here, and
# then reads off the weights what the patching found.
#
# ## A model with an induction head
#
# The five-minute tutorial's model: two layers of four heads, trained for 300 steps on random
# tokens that repeat, where only an induction head predicts the repeats.

# %%
import torch

import qkov

torch.manual_seed(0)
cfg = qkov.Config(n_layers=2, n_heads=4, d_model=64, d_head=16, d_vocab=64, n_ctx=32)
model = qkov.Transformer(cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _ in range(300):
    period = int(torch.randint(4, 17, ()))
    tokens = torch.randint(0, cfg.d_vocab, (64, period)).repeat(1, cfg.n_ctx // period + 1)[:, : cfg.n_ctx]
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(
        logits[:, period - 1 : -1].reshape(-1, cfg.d_vocab), tokens[:, period:].reshape(-1)
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
model.eval()
print(f"loss on the repeats: {loss.item():.3f} nats")

# %% [markdown]
# ## Clean and corrupted inputs, and a metric
#
# Clean: eight random tokens, then the same eight again. Corrupted: the first eight replaced by
# others, so nothing earlier in the context predicts the second half. The metric is the mean
# log-probability of the right next token over the second half's predictions, as ARENA's logit
# difference is a number that the clean run makes high and the corrupted one low.

# %%
period, batch = 8, 16
first = torch.randint(0, cfg.d_vocab, (batch, period))
clean = torch.cat([first, first], dim=1)
corrupted = torch.cat([torch.randint(0, cfg.d_vocab, (batch, period)), first], dim=1)


def metric(logits: torch.Tensor) -> float:
    """Mean log-probability of the next token over the second half's predictions (positions 8 to 14
    predict tokens 9 to 15, each the token one period earlier in the clean input)."""
    logp = logits[:, period:-1].log_softmax(-1)
    return logp.gather(-1, clean[:, period + 1 :, None]).mean().item()


clean_logits, clean_cache = model.run_with_cache(clean)
corrupted_logits = model(corrupted)
print(f"clean {metric(clean_logits):.2f}, corrupted {metric(corrupted_logits):.2f} (nats)")

# %% [markdown]
# `clean_cache` is an `ActivationCache`: TransformerLens' short keys read it
# (`clean_cache["resid_pre", 1]`, `clean_cache["pattern", 0]`), and so do the full hook names.
#
# ## Patching the residual stream, one layer and position at a time
#
# The hook puts the clean run's residual stream at one position into the corrupted run. The score is
# the share of the clean-corrupted gap that comes back (1: all of it, 0: none).

# %%
gap = metric(clean_logits) - metric(corrupted_logits)
restored = torch.zeros(cfg.n_layers, clean.shape[1])
for layer in range(cfg.n_layers):
    for pos in range(clean.shape[1]):

        def patch(resid, hook, pos=pos):
            resid[:, pos] = clean_cache[hook.name][:, pos]

        logits = model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)])
        restored[layer, pos] = (metric(logits) - metric(corrupted_logits)) / gap
print("share of the gap restored, by layer (rows) and position (columns):")
print((restored * 100).round().int())

# %% [markdown]
# Read it with the induction mechanism in mind. At layer 0 a position's stream is its token alone:
# giving one position of the first half back its clean token restores almost nothing, because an
# induction head needs two neighbouring tokens of the first copy (the key's previous token and the
# value's own token) to predict one token of the second. At layer 1 each position of the first
# half carries both, after layer 0 has moved the previous token into it, so each patched position
# brings back about one of the seven predictions; the second half's positions, identical in both
# inputs, bring back nothing.
#
# ## Patching each head's output
#
# `hook_z` is each head's mixed values, `[batch, pos, n_heads, d_head]` (before `W_O`), as in
# TransformerLens; the hook replaces one head's at every position.

# %%
by_head = torch.zeros(cfg.n_layers, cfg.n_heads)
for layer in range(cfg.n_layers):
    for head in range(cfg.n_heads):

        def patch_head(z, hook, head=head):
            z[:, :, head] = clean_cache[hook.name][:, :, head]

        logits = model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", patch_head)])
        by_head[layer, head] = (metric(logits) - metric(corrupted_logits)) / gap
for layer in range(cfg.n_layers):
    print(f"layer {layer}: " + "  ".join(f"L{layer}H{h} {by_head[layer, h]:+.2f}" for h in range(cfg.n_heads)))

# %% [markdown]
# The layer-1 heads that restore the most are the model's induction heads; each layer-0 head alone
# restores little, since the keys are built from several of them.
#
# ## What the weights say
#
# Patching says where the difference is carried; qkov reads why off the weights. The analysis finds
# the induction and previous-token heads on repeated random tokens, and the composition scores say
# through which of its inputs (query, key or value) the induction head reads layer 0.

# %%
results = qkov.analyze(model, show_progress=False)
print("induction heads:", results.repeated_tokens.induction_heads)
print("previous-token heads:", results.repeated_tokens.previous_token_heads)
results.composition

# %% [markdown]
# `tests/test_tl_habits.py` runs this kind of patching (the residual stream by layer and position,
# and each head through `hook_z` and `hook_result`) in qkov and in TransformerLens 3 on the same
# converted model with the same hook functions, and compares every number
# ([From TransformerLens](../from-transformerlens.md) maps the other calls).
