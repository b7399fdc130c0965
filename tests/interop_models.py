"""Random GPT-2 and TransformerLens models built locally (every weight drawn, LayerNorm's too), the
tokens they read, and a GPT-2 folder as ``save_pretrained`` writes it: the sources the interop tests
import from."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from tokenizers import Tokenizer, models

transformers = pytest.importorskip("transformers")
tl = pytest.importorskip("transformer_lens")
transformers.logging.set_verbosity_error()
logging.getLogger("transformer_lens").setLevel(logging.ERROR)

FP32_TOLERANCE = 1e-4  # the bound for float32 logits; measured: at most 3e-7 on these shapes
FP64_TOLERANCE = 1e-10


def hf_model(n_layers=2, n_heads=3, d_model=12, d_vocab=23, n_ctx=9, seed=0, **extra):
    """A random GPT-2 built locally, with LayerNorm weights and biases drawn too (GPT-2 initialises
    them to 1 and 0, which would make folding them trivial)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=n_layers,
        n_head=n_heads,
        n_embd=d_model,
        vocab_size=d_vocab,
        n_positions=n_ctx,
        bos_token_id=0,
        eos_token_id=0,
        **extra,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln_" in name:
                param.copy_(torch.randn_like(param) * 0.3 + ("weight" in name))
            elif name.endswith("bias"):
                param.copy_(torch.randn_like(param) * 0.1)
    return model


def tl_model(attn_only: bool, n_ctx=9, d_vocab=23, seed=0, positions="standard", normalization="LN"):
    """A random TransformerLens model with LayerNorm (attention-only or with MLPs), every weight
    and bias drawn."""
    cfg = tl.HookedTransformerConfig(
        n_layers=2,
        d_model=12,
        n_heads=3,
        d_head=4,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        attn_only=attn_only,
        d_mlp=None if attn_only else 20,
        act_fn=None if attn_only else "gelu_new",
        normalization_type=normalization,
        positional_embedding_type=positions,
        device="cpu",
        seed=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tl.HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shift = 1.0 if name.endswith(".w") else 0.0
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3 + shift)
    return model


TOKENS = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(5))


def centred(logits):
    return logits - logits.mean(-1, keepdim=True)


def gpt2_folder(path, tokenizer=True, **kwargs):
    model = hf_model(**kwargs)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        vocab = {chr(97 + i): i for i in range(23)}
        (path / "tokenizer.json").write_text(Tokenizer(models.BPE(vocab=vocab, merges=[])).to_str())
    return model
