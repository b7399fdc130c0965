"""Grouped-query attention's group similarities and a rotary head's frequency bands, against dense
float64 products over a small vocabulary, and on hand-built cases whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from qkov.circuits.groups import group_similarity
from qkov.circuits.rotary_bands import rotary_bands
from qkov.config import Config
from qkov.model import Transformer
from qkov.rotary import frequencies, plane_index, rotation


def model_of(**overrides) -> Transformer:
    base = dict(
        n_layers=2, n_heads=4, d_model=16, d_head=8, d_vocab=30, n_ctx=64, positional_embedding="rotary"
    )
    torch.manual_seed(0)
    return Transformer(Config(**(base | overrides))).double().requires_grad_(False)


def dense_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_group_cosines_are_those_of_the_dense_circuits():
    model = model_of(n_key_value_heads=2)
    found = group_similarity(model)
    assert [(g.layer, g.group, g.heads) for g in found][:2] == [
        (0, 0, ["L0H0", "L0H1"]),
        (0, 1, ["L0H2", "L0H3"]),
    ]
    mix = sum(rotation(model.cfg, d, 1) for d in range(1, 65)) / 64
    for group in found:  # every pair, both ways: the shared W_K and W_V are formed once per group
        attn, heads = model.blocks[group.layer].attn, [2 * group.group, 2 * group.group + 1]
        ov = [model.W_E @ attn.W_V[h] @ attn.W_O[h] @ model.W_U for h in heads]
        qk = [model.W_E @ attn.W_Q[h] @ mix @ attn.W_K[h].T @ model.W_E.T for h in heads]
        for i in range(2):
            for j in range(2):
                assert group.ov[i][j] == pytest.approx(dense_cos(ov[i], ov[j]), abs=1e-10)
                assert group.qk[i][j] == pytest.approx(dense_cos(qk[i], qk[j]), abs=1e-10)


def test_heads_with_the_same_output_weights_are_one_head():
    model = model_of(n_key_value_heads=1)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O[1:] = block.attn.W_O[0]
            block.attn.W_Q[1:] = 2 * block.attn.W_Q[0]  # a scale does not change a cosine
    for group in group_similarity(model):
        assert torch.allclose(
            torch.tensor(group.ov, dtype=torch.float64), torch.ones(4, 4, dtype=torch.float64), atol=1e-12
        )
        assert torch.allclose(
            torch.tensor(group.qk, dtype=torch.float64), torch.ones(4, 4, dtype=torch.float64), atol=1e-12
        )
    assert group_similarity(model_of()) == []  # every head its own keys and values: no groups


@pytest.mark.parametrize("kv_heads", [4, 2])  # each head its own keys, and groups of two sharing them
def test_band_shares_are_the_dense_terms_norms(kv_heads):
    model = model_of(rotary_dim=4, n_key_value_heads=kv_heads)
    bands = rotary_bands(model)
    first, second = plane_index(model.cfg)
    attn, E = model.blocks[0].attn, model.W_E
    groups = [[a, b] for a, b in zip(first.tolist(), second.tolist(), strict=True)] + [list(range(4, 8))]
    for h in range(4):
        W_K = attn.kv_params("W_K")[h // (4 // kv_heads)]
        norms = torch.stack([(E @ attn.W_Q[h][:, g] @ W_K[:, g].T @ E.T).norm() for g in groups])
        shares = norms / norms.sum()
        head = bands.heads[h]
        assert head.head == f"L0H{h}"
        assert head.shares == pytest.approx(shares[:-1].tolist(), abs=1e-10)
        assert head.position_free == pytest.approx(float(shares[-1]), abs=1e-10)
    assert bands.wavelengths[0] == pytest.approx((2 * math.pi / frequencies(model.cfg)).tolist())


def test_a_head_that_uses_only_its_slowest_plane_is_all_content():
    """A head whose queries and keys live only in the lowest-frequency plane (a wavelength of
    thousands of tokens) has all its circuit there, none positional."""
    model = model_of(n_layers=1)
    slow = plane_index(model.cfg)[0][-1], plane_index(model.cfg)[1][-1]
    with torch.no_grad():
        keep = torch.zeros(8, dtype=torch.float64)
        keep[[int(i) for i in slow]] = 1.0
        model.blocks[0].attn.W_Q.mul_(keep)
    head = rotary_bands(model).heads[0]
    assert head.shares[-1] == pytest.approx(1.0) and head.positional == 0.0 and head.position_free == 0.0
    with pytest.raises(ValueError, match="rotary"):
        rotary_bands(model_of(positional_embedding="standard"))


def test_a_gated_neuron_has_keys_through_its_gate_and_its_input():
    """``gated_by`` is the top of ``W_E W_gate[:, n]``, ``excited_by`` of ``W_E W_in[:, n]``; the last
    layer's exact direct split still sums to the logits (an activation is an activation)."""
    from qkov.circuits.neurons import neuron_analysis

    model = model_of(n_layers=1, d_mlp=12, gated_mlp=True, act_fn="silu", normalization="RMS")
    tokens = torch.randint(0, 30, (2, 10), generator=torch.Generator().manual_seed(0))
    found = neuron_analysis(model, tokens, k=4)
    assert found.max_error < 1e-10
    neuron = found.layers[0].neurons[0]
    gate = (model.W_E @ model.blocks[0].mlp.W_gate)[:, neuron.neuron] * 1.0
    assert neuron.gated_by == gate.topk(4).indices.tolist()


def test_neurons_of_a_model_with_fewer_tokens_than_a_list():
    """Five tokens and two output classes: each list holds what there is (it once asked for 10)."""
    from qkov.circuits.neurons import neuron_analysis

    model = model_of(n_layers=1, d_mlp=6, d_vocab=5, d_vocab_out=2, positional_embedding="standard")
    found = neuron_analysis(model)
    assert len(found.layers[0].neurons[0].excited_by) == 5 and len(found.layers[0].neurons[0].raises) == 2


def test_the_position_free_part_is_the_same_at_every_offset():
    """A partially rotary head's QK circuit at any offset minus its rotating planes' part is the
    position-free circuit; in a model without rotation it is the whole circuit."""
    import qkov

    model = model_of(rotary_dim=4)
    free = qkov.position_free_qk_circuit(model).AB
    rotating = slice(0, 4)
    for offset in (0, 3, 17):
        attn = model.blocks[1].attn
        whole = attn.W_Q @ rotation(model.cfg, offset, 1) @ attn.W_K.mT
        planes = (
            attn.W_Q[..., rotating]
            @ rotation(model.cfg, offset, 1)[rotating, rotating]
            @ attn.W_K[..., rotating].mT
        )
        assert torch.allclose(whole - planes, free[1], atol=1e-10)
    plain = model_of(positional_embedding="standard")
    assert torch.allclose(qkov.position_free_qk_circuit(plain).AB, qkov.qk_circuit(plain).AB, atol=1e-12)
