"""The forward pass against an independent float64 reference and against TransformerLens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov

from conftest import random_model
from reference import reference_forward

SCHEMES = ["shortformer", "standard", "none"]


def weights_of(model):
    return {n: p.detach().double().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n_layers", [0, 1, 2, 3])
@pytest.mark.parametrize("biases", [False, True])
def test_forward_matches_float64_reference(scheme, n_layers, biases):
    cfg = qkov.Config(
        n_layers=n_layers, n_heads=3, d_model=12, d_head=5, d_vocab=17, n_ctx=9, positional_embedding=scheme
    )
    model = random_model(cfg, seed=n_layers, biases=biases).double()
    tokens = torch.randint(0, cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    expected, patterns, writes, _ = reference_forward(weights_of(model), cfg, tokens.numpy())
    logits, cache = model.run_with_cache(tokens)
    np.testing.assert_allclose(model(tokens).detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(logits.detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    for layer in range(n_layers):
        np.testing.assert_allclose(
            cache[f"blocks.{layer}.attn.hook_pattern"].detach().numpy(),
            patterns[layer],
            rtol=1e-10,
            atol=1e-12,
        )
        np.testing.assert_allclose(
            cache[f"blocks.{layer}.attn.hook_result"].detach().numpy(), writes[layer], rtol=1e-10, atol=1e-10
        )


GPT2_STYLE = [  # (normalization, d_mlp, act_fn, scheme)
    ("LN", 0, "gelu_new", "standard"),
    ("LN", 20, "gelu_new", "standard"),
    ("LNPre", 20, "gelu", "standard"),
    ("none", 20, "relu", "none"),
    ("LN", 20, "relu", "shortformer"),
]


@pytest.mark.parametrize(("normalization", "d_mlp", "act_fn", "scheme"), GPT2_STYLE)
@pytest.mark.parametrize("n_layers", [1, 3])
@pytest.mark.parametrize("biases", [False, True])
def test_layer_norm_and_mlp_forward_matches_float64_reference(
    normalization, d_mlp, act_fn, scheme, n_layers, biases
):
    cfg = qkov.Config(
        n_layers=n_layers,
        n_heads=3,
        d_model=12,
        d_head=5,
        d_vocab=17,
        n_ctx=9,
        positional_embedding=scheme,
        normalization=normalization,
        d_mlp=d_mlp,
        act_fn=act_fn,
    )
    model = random_model(cfg, seed=n_layers, biases=biases).double()
    tokens = torch.randint(0, cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    expected, patterns, writes, resid = reference_forward(weights_of(model), cfg, tokens.numpy())
    logits, cache = model.run_with_cache(tokens)
    np.testing.assert_allclose(model(tokens).detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(logits.detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        cache[f"blocks.{n_layers - 1}.hook_resid_post"].detach().numpy(), resid, rtol=1e-10, atol=1e-10
    )
    for layer in range(n_layers):
        np.testing.assert_allclose(
            cache[f"blocks.{layer}.attn.hook_result"].detach().numpy(), writes[layer], rtol=1e-10, atol=1e-10
        )
    # the loss goes through the same final norm
    expected_loss = torch.nn.functional.cross_entropy(
        torch.from_numpy(expected[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
    )
    torch.testing.assert_close(model.loss(tokens), expected_loss, rtol=1e-10, atol=1e-10)


def test_attention_only_default_is_unchanged():
    """The new options default to today's attention-only model: same parameters, same draws."""
    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=11, n_ctx=6)
    model = qkov.AttnOnlyTransformer(cfg)
    assert qkov.AttnOnlyTransformer is qkov.Transformer
    assert (cfg.normalization, cfg.d_mlp, cfg.source) == ("none", 0, "qkov")
    expected = ["W_E", "W_pos", "W_U"] + [f"blocks.{layer}.attn.W_{x}" for layer in range(2) for x in "QKVO"]
    assert sorted(name for name, _ in model.named_parameters()) == sorted(expected)
    # the initialisation draws exactly what it did before MLPs existed (W_E is the first draw)
    torch.testing.assert_close(model.W_E, torch.randn(11, 8, generator=torch.Generator().manual_seed(0)))


def test_float32_forward_is_close_to_float64():
    """float32 rounding only (at most 2.4e-5 of the logits' scale over 200 token draws of this
    model, whose large random weights make sharp softmaxes), never a wrong formula."""
    cfg = qkov.Config(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=50, n_ctx=16)
    model = random_model(cfg)
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(0))
    expected, *_ = reference_forward(weights_of(model), cfg, tokens.numpy())
    error = np.abs(model(tokens).detach().numpy() - expected).max()
    assert error < 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_residual_stream_is_the_sum_of_every_write(scheme):
    """Section "Residual Stream": embedding (+ positions) + every head's write = final stream."""
    cfg = qkov.Config(
        n_layers=3, n_heads=4, d_model=16, d_head=4, d_vocab=23, n_ctx=10, positional_embedding=scheme
    )
    model = random_model(cfg).double()
    tokens = torch.randint(0, 23, (2, 10))
    logits, cache = model.run_with_cache(tokens)
    start = cache["hook_embed"] + (cache["hook_pos_embed"] if scheme == "standard" else 0)
    total = start + sum(cache[f"blocks.{layer}.attn.hook_result"].sum(dim=2) for layer in range(3))
    torch.testing.assert_close(total, cache["blocks.2.hook_resid_post"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total @ model.W_U, logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("biases", [False, True])
def test_frozen_patterns_are_used_and_make_the_model_linear(biases):
    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=8, d_head=4, d_vocab=11, n_ctx=6)
    model = random_model(cfg, biases=biases).double()
    tokens = torch.randint(0, 11, (2, 6))
    _, cache = model.run_with_cache(tokens)
    own = [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(2)]
    torch.testing.assert_close(model.run_with_cache(tokens, patterns=own)[0], model(tokens))
    # Uniform causal attention, frozen: the float64 reference with the same frozen patterns.
    uniform = torch.tril(torch.ones(6, 6, dtype=torch.float64))
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(2, 2, 6, 6)
    frozen = [uniform, uniform]
    expected, *_ = reference_forward(weights_of(model), cfg, tokens.numpy(), patterns=frozen)
    np.testing.assert_allclose(
        model.run_with_cache(tokens, patterns=frozen)[0].detach().numpy(), expected, rtol=1e-10
    )
    if biases:
        return  # with biases the frozen model is affine, not linear
    # Linear in the embedding: doubling W_E (with the patterns frozen) doubles every head write.
    logits_a, cache_a = model.run_with_cache(tokens, patterns=frozen)
    with torch.no_grad():
        model.W_E.mul_(2.0)
    _, cache_b = model.run_with_cache(tokens, patterns=frozen)
    for layer in range(2):
        torch.testing.assert_close(
            cache_b[f"blocks.{layer}.attn.hook_result"], 2 * cache_a[f"blocks.{layer}.attn.hook_result"]
        )


@pytest.mark.parametrize("post_norms", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_hook_on_the_head_writes_moves_the_layer_write_by_what_it_changed(post_norms, in_place):
    """``hook_result`` is formed only when read: the layer's write is one product over the heads,
    and a hook that changes a head's write (in place or returned) moves it by exactly that change;
    after a norm after the attention the writes are the normed ones and its scale stays the clean
    run's. Nothing read, the write is the same bits as with every head's write kept."""
    norms = dict(normalization="RMSPre", post_norms=True) if post_norms else {}
    model = random_model(
        qkov.Config(n_layers=2, n_heads=3, d_model=16, d_head=4, d_vocab=23, n_ctx=10, d_mlp=8, **norms),
        biases=True,
    ).double()
    tokens = torch.randint(0, 23, (3, 10), generator=torch.Generator().manual_seed(0))
    _, clean = model.run_with_cache(tokens)
    result, out = "blocks.0.attn.hook_result", "blocks.0.hook_attn_out"
    heads = clean[result]

    def scaled(act, hook):
        if not in_place:
            act = act.clone()
        act[:, :, 1] *= 3.0
        return act

    _, hooked = model.run_with_cache(tokens, fwd_hooks=[(result, scaled)])
    torch.testing.assert_close(hooked[out], clean[out] + 2 * heads[:, :, 1], rtol=0, atol=1e-12)
    if not post_norms:  # the one product equals the heads' writes summed, to float rounding
        torch.testing.assert_close(clean[out], heads.sum(2) + model.blocks[0].attn.b_O, rtol=0, atol=1e-12)
    _, unread = model.run_with_cache(tokens, names_filter=out)
    assert result not in unread and torch.equal(unread[out], clean[out])


def test_zero_layer_model_is_a_bigram_table():
    cfg = qkov.Config(n_layers=0, n_heads=1, d_model=8, d_head=8, d_vocab=13, n_ctx=5)
    model = random_model(cfg)
    tokens = torch.arange(5)[None]
    torch.testing.assert_close(model(tokens)[0], (model.W_E @ model.W_U)[:5])


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (torch.zeros(1, 9, dtype=torch.long), "longer than the context"),
        (torch.tensor([[0, 1, 20]]), "must lie in"),
        (torch.tensor([[0, -1]]), "must lie in"),
        (torch.zeros(1, 3), "integer ids"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "shape"),
    ],
)
def test_bad_tokens_raise_a_clear_error(tokens, message):
    model = qkov.AttnOnlyTransformer(qkov.Config(1, 2, 8, 4, 20, 8))
    with pytest.raises(qkov.QkovError, match=message):
        model(tokens)


# --- TransformerLens 3.x as an oracle -------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("biases", [False, True])
def test_forward_matches_transformer_lens(scheme, biases):
    pytest.importorskip("transformer_lens")
    cfg = qkov.Config(
        n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=61, n_ctx=24, positional_embedding=scheme
    )
    model = random_model(cfg, biases=biases).double()
    reference = qkov.interop.to_hooked_transformer(model)
    tokens = torch.randint(0, 61, (3, 24))
    ours, cache = model.run_with_cache(tokens)
    theirs, tl_cache = reference.run_with_cache(tokens)
    torch.testing.assert_close(model(tokens), theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    for layer in range(2):
        for hook in ("attn.hook_pattern", "attn.hook_result", "hook_resid_post"):
            name = f"blocks.{layer}.{hook}"
            torch.testing.assert_close(cache[name], tl_cache[name], rtol=1e-10, atol=1e-10)
