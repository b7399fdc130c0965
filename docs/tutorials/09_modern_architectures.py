# %% [markdown]
# # Today's architectures: rotary positions, grouped-query attention, RMSNorm
#
# The paper's models have learned positions, LayerNorm (or none) and one key and value per head. The
# models studied now (Pythia, Llama, Gemma, Qwen, OLMo) rotate queries and keys by position (RoPE),
# share keys and values across groups of query heads, normalise by the root mean square and gate
# their MLPs. qkov reads each of them as options of its one model, from the folder
# `save_pretrained` writes, and computes the paper's objects for them exactly where the mathematics
# allows (the list of what is exact under which feature is in [Architectures](../architectures.md)).
#
# Nothing is downloaded: `transformers` builds a Pythia-shaped and a Llama-shaped model from their own
# config classes with random weights, and saves them as a Hugging Face folder (the Llama one in
# bfloat16 and sharded, as large checkpoints are shared).

# %%
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

import qkov

transformers.utils.logging.disable_progress_bar()  # its save and load bars would fill the page
transformers.utils.logging.set_verbosity_error()

torch.manual_seed(0)
folder = Path(tempfile.mkdtemp())
pythia = GPTNeoXForCausalLM(GPTNeoXConfig(
    vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=128, rotary_pct=0.25,  # Pythia rotates a quarter of each head
    initializer_range=0.3,  # larger than a fresh model's 0.02, so that random heads have visible scores
)).eval()  # fmt: skip
pythia.save_pretrained(folder / "pythia")
llama = LlamaForCausalLM(LlamaConfig(
    vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
    intermediate_size=128, max_position_embeddings=128, initializer_range=0.3,
)).eval()  # fmt: skip
llama.to(torch.bfloat16).save_pretrained(folder / "llama", max_shard_size="40KB")
sorted(p.name for p in (folder / "llama").iterdir())

# %% [markdown]
# `qkov.open_model` (and `qkov analyze`, `qkov serve`) take such a folder directly. The model it gives
# is qkov's, with the family's options named in its config; the weights are folded (RMSNorm's weight
# into the weights that read its output) and computed in float32 (bfloat16 has no kernels for the
# analyses' QR and eigenvalues, and every bfloat16 number is exactly a float32 one).

# %%
model = qkov.open_model(folder / "llama")
print(model.cfg.features)
tokens = torch.randint(0, 96, (2, 24))
reloaded = LlamaForCausalLM.from_pretrained(folder / "llama", dtype=torch.float32).eval()  # the same folder
with torch.no_grad():
    gap = (model(tokens).log_softmax(-1) - reloaded(tokens).logits.log_softmax(-1)).abs().max()
print(f"largest log-probability difference from transformers' float32 forward: {float(gap):.1e}")

# %% [markdown]
# ## A rotary head's QK circuit at an offset
#
# Rotating a query at position `i` by `R(i)` and a key at `j` by `R(j)` leaves their score a function
# of the offset `d = i - j` alone: `x_i W_Q R(d) W_K^T x_j^T` (row vectors; the paper writes
# `W_Q^T W_K` and has no rotation). So a RoPE head has one QK circuit per offset, each still of rank
# `d_head` and kept factored: `qkov.full_qk_circuit(model, offset=d)` is the token-by-token circuit
# (row = query token, column = key token) at offset `d`, exact up to each token's RMSNorm scale, as
# the paper's LayerNorm circuits are. Without `offset`, analyses average over offsets 1 to 64 (a key
# 1 to 64 tokens back), and say so.

# %%
with torch.no_grad():
    for d in (0, 1, 4, 32):
        circuit = qkov.full_qk_circuit(model, offset=d)[0, 0]  # L0H0
        top = [round(v, 2) for v in circuit.topk(3).values.tolist()]
        print(f"offset {d:2d}: norm {float(circuit.norm()):7.2f}, largest scores {top}")

# %% [markdown]
# The circuit at an offset is the model's own score, exactly: here the scores of layer 0 between
# every query and the key `d` tokens back, recomputed from the factored circuit.

# %%
with torch.no_grad():
    _, cache = model.run_with_cache(tokens)
    x = model.blocks[0].ln1(cache["blocks.0.hook_resid_pre"])
    q, k, _ = model.blocks[0].attn.qkv(x, None)
    scores = q @ k.mT / model.blocks[0].attn.scale
    d = 4
    qk = qkov.qk_circuit(model, offset=d)[0, 0].AB / model.cfg.d_head**0.5
    from_circuit = torch.einsum("bid,de,bje->bij", x, qk, x)
rows = torch.arange(d, 24)
gap = (scores[:, 0, rows, rows - d] - from_circuit[:, rows, rows - d]).abs().max()
print(f"largest difference at offset {d}: {float(gap):.1e} (float32 rounding)")

# %% [markdown]
# ## Position or content: a head by frequency band
#
# A head's QK circuit is a sum over its rotation planes. A plane that turns fully within a few tokens
# can only say how far back to look; a plane that barely turns over the context (and, in a partially
# rotary head like Pythia's, the dimensions that do not rotate at all) says which tokens to look at
# wherever they are: the skip-trigrams of the paper. `qkov.rotary_bands` splits every head, exactly,
# from `d_model`-sized algebra.

# %%
pythia_model = qkov.open_model(folder / "pythia")
bands = qkov.rotary_bands(pythia_model)
for head in bands.heads[:4]:
    print(f"{head.head}: positional {head.positional:.2f}, slower planes "
          f"{1 - head.positional - head.position_free:.2f}, no rotation {head.position_free:.2f}")
print("wavelengths of layer 0's planes (tokens):", [round(w, 1) for w in bands.wavelengths[0]])

# %% [markdown]
# ## A group of heads side by side
#
# Llama's 8 query heads per layer share 2 key/value heads: each group of 4 reads the same `W_V` and
# `W_K`. How alike the heads of a group are is the cosine between their full OV circuits (and full
# QK circuits) over the whole vocabulary, computed exactly without building a vocabulary-sized matrix.
# Random heads are nearly orthogonal; a trained group whose cosines are near 1 acts as one head.

# %%
group = qkov.group_similarity(model)[0]
print(group.heads)
torch.tensor(group.ov)

# %% [markdown]
# ## Every analysis, or a line saying why not
#
# `analyze` (from `qkov.analyze`) runs every step; the results say which offset the QK circuits use and which steps do
# not apply (here: no corpus, no task data, more than one layer; nothing that this model's features
# make inexact).

# %%
from qkov.analyze import analyze  # noqa: E402

results = analyze(model, show_progress=False)
for note in results.circuit_notes:
    print("-", note)
print(results.skipped)
