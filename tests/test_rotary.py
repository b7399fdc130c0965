"""Rotary positions and the circuits that read them: the rotation's algebra (hypothesis), the QK
circuit at an offset against the model's own attention scores (dense float64), the circuit view of
query/key norms up to each query's and key's scale, and the frequency bands."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkov
from families import family_configs, random_hf_model
from qkov.config import Config
from qkov.interop import from_hf
from qkov.interop.fold import circuit_model, fold
from qkov.rotary import frequencies, rotate, rotation

pytest.importorskip("transformers")
CONFIGS = dict(family_configs())


def rotary_config(**overrides) -> Config:
    base = dict(
        n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=20, n_ctx=64, positional_embedding="rotary"
    )
    return Config(**(base | overrides))


@settings(max_examples=40, deadline=None)
@given(
    i=st.integers(0, 200), j=st.integers(0, 200), interleaved=st.booleans(),
    rotary_dim=st.sampled_from([2, 4, 8]),
    scaling=st.sampled_from([None, {"rope_type": "linear", "factor": 3.0}, {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}]),
)  # fmt: skip
def test_rotations_compose_by_offset(i, j, interleaved, rotary_dim, scaling):
    """``R(i) R(j)^T = R(i - j)``: a score depends on the offset alone, and ``R`` is orthogonal."""
    cfg = rotary_config(rotary_interleaved=interleaved, rotary_dim=rotary_dim, rotary_scaling=scaling)
    product = rotation(cfg, i) @ rotation(cfg, j).T
    assert torch.allclose(product, rotation(cfg, i - j), atol=1e-10)
    assert torch.allclose(
        rotation(cfg, i) @ rotation(cfg, i).T, torch.eye(8, dtype=torch.float64), atol=1e-12
    )


def test_rotate_is_multiplication_by_the_rotation():
    cfg = rotary_config(rotary_dim=4)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    positions = torch.arange(5, dtype=torch.float64)[:, None] * frequencies(cfg)[None, :]
    rotated = rotate(x, positions, cfg)
    for p in range(5):
        assert torch.allclose(rotated[:, p], x[:, p] @ rotation(cfg, p), atol=1e-12)
    assert torch.equal(rotated[..., 4:], x[..., 4:])  # the dimensions past rotary_dim carry no position


def folded(name, tmp_path):
    model = random_hf_model(CONFIGS[name])
    model.save_pretrained(tmp_path)
    return fold(from_hf(tmp_path, fold=False).double()).model


def model_scores(attn, x):
    """The layer's pre-cap scores ``q . k / scale`` on inputs ``x`` (what its norm hands it)."""
    q, k, _ = attn.qkv(x, None)
    return q @ k.transpose(-1, -2) / attn.scale


@pytest.mark.parametrize("name", ["llama", "llama-mqa-bias", "gptj", "gpt_neox", "gemma2", "phi3"])
def test_the_qk_circuit_at_an_offset_is_the_models_score(name, tmp_path):
    """Row ``i``, column ``i - d`` of the model's scores is ``x_i W_Q R(d) W_K^T x_{i-d}^T / s``:
    what :func:`qkov.qk_circuit` (and the circuit view) give at offset ``d``, exactly."""
    model = folded(name, tmp_path)
    x = torch.randn(1, 12, model.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for layer, block in enumerate(model.blocks):
        scores = model_scores(block.attn, x)[0]  # [n_heads, dest, src]
        for d in (0, 1, 5):
            view = circuit_model(model, range(d, d + 1)).blocks[layer].attn
            q = x[0] @ view.W_Q + (0 if view.b_Q is None else view.b_Q[:, None, :])
            k = x[0] @ view.W_K + (0 if view.b_K is None else view.b_K[:, None, :])
            expected = q @ k.transpose(-1, -2) / model.cfg.d_head**0.5
            rows = torch.arange(d, 12)
            assert torch.allclose(scores[:, rows, rows - d], expected[:, rows, rows - d], atol=1e-10)
        qk = qkov.qk_circuit(model, offset=3)[layer]
        dense = block.attn.W_Q @ rotation(model.cfg, 3, layer) @ block.attn.W_K.mT
        assert torch.allclose(qk.AB * model.cfg.d_head**-0.5, dense / block.attn.scale, atol=1e-10)


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "gemma3_text"])
def test_with_query_and_key_norms_the_circuit_is_exact_up_to_each_ones_scale(name, tmp_path):
    """``score[i, j] = view[i, j] / (s_q(i) s_k(j))``: the gains are in the circuit, each query's and
    key's own RMS scale is not."""
    model = folded(name, tmp_path)
    x = torch.randn(1, 10, model.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    attn = model.blocks[0].attn
    scores = model_scores(attn, x)[0]
    view = circuit_model(model, range(0, 1)).blocks[0].attn
    expected = (x[0] @ view.W_Q) @ (x[0] @ view.W_K).mT / model.cfg.d_head**0.5
    ratio = (expected / scores)[:, 4, 4]  # offset 0: the diagonal, where the rotation is the identity
    raw_q = torch.einsum("pd,hde->hpe", x[0], attn.W_Q)
    raw_k = torch.einsum("pd,hde->hpe", x[0], attn.W_K)
    if model.cfg.qk_norm == "head":
        s_q, s_k = attn.q_norm.scale(raw_q)[:, 4, 0], attn.k_norm.scale(raw_k)[:, 4, 0]
    else:  # OLMo 2: one scale over all heads' queries, and one over the key/value heads' keys
        stored_k = torch.einsum("pd,hde->phe", x[0], attn.kv_params("W_K")).flatten(1)
        s_q = attn.q_norm.scale(raw_q.transpose(0, 1).flatten(1))[4, 0]
        s_k = attn.k_norm.scale(stored_k)[4, 0]
    assert torch.allclose(ratio, s_q * s_k, rtol=1e-9)


@pytest.mark.parametrize(
    "name",
    ["llama", "gpt_neox", "gptj", "mistral", "gemma", "phi3", "qwen3", "olmo2", "gemma2", "gemma3_text"],
)
@pytest.mark.parametrize("fold_it", [False, True])
def test_score_attribution_under_rotary_positions_sums_to_the_scores(name, fold_it, tmp_path):
    """Each part's query and key, rotated by position (a rotation is linear), make up the scores
    (before a soft-cap); with query and key norms, each part divided by its whole query's (key's)
    frozen scale; earlier heads' writes through their post-attention norms at its frozen scale."""
    model = random_hf_model(CONFIGS[name])
    model.save_pretrained(tmp_path)
    ours = from_hf(tmp_path, fold=fold_it).double()
    tokens = torch.randint(0, ours.cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(2))
    _, cache = ours.run_with_cache(tokens)
    layer = ours.cfg.n_layers - 1  # earlier heads' writes through their post-attention norms, frozen
    block = ours.blocks[layer]
    resid = cache[f"blocks.{layer}.hook_resid_pre"]
    x = resid if block.ln1 is None else block.ln1(resid)
    q, k, _ = block.attn.qkv(x, None)
    scores = (q @ k.mT / block.attn.scale)[:, 1]
    total = sum(qkov.score_attribution(ours, tokens, f"L{layer}H1").values())
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (total - scores)[..., causal].abs().max() < 1e-10 * scores.abs().max()
