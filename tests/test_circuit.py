"""The circuit graph: the hand-built models' planted edges (K-composition of induction, the pointer's
Q-composition, the two-back head's V-composition) come out with their kinds, weights and ACDC
names; every side's shares sum to 1 and match dense float64 computations from the model's own
cache; roles come from the analyses that own them; and the registered step."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import TypeAdapter

import qkov
from families import family_configs, random_hf_model
from qkov.analyze import run_steps
from qkov.circuits.attribution import read_parts, score_parts, stream_parts
from qkov.circuits.circuit import Circuit, acdc_name, circuit_graph, reader_edges, score_shares, value_shares
from qkov.circuits.paths import freeze, post_linear
from qkov.data.random_tokens import repeated_random_tokens
from qkov.model import LayerNorm, RMSNorm
from qkov.names import head_name, hook_name, norm_name, parse_head
from test_correction import centred_share

from conftest import float64_model
from handbuilt import induction_model, pointer_arithmetic_model, two_back_model, with_recent_head

PERIOD = 4


def repeated(model, period: int = PERIOD) -> torch.Tensor:
    return repeated_random_tokens(8, period, 3, model.cfg.d_vocab, torch.Generator().manual_seed(0))


def edge(circuit: Circuit, writer: str, reader: str, kind: str):
    found = [e for e in circuit.edges if (e.writer, e.reader, e.kind) == (writer, reader, kind)]
    return found[0] if found else None


def test_acdc_names():
    assert (
        acdc_name("L0H3", "L1H4", "K") == "blocks.1.hook_k_input[:, :, 4]<-blocks.0.attn.hook_result[:, :, 3]"
    )
    assert acdc_name("L2H0", "L5H11", "Q").startswith("blocks.5.hook_q_input[:, :, 11]<-blocks.2.")


def test_the_planted_edges():
    model = induction_model().double()
    k = edge(circuit_graph(model, repeated(model), {}), "L0H0", "L1H0", "K")
    assert k is not None and k.weight > 0.5 and k.parts == {"L0H0": k.weight, "L0H0.pos": 0.0}
    assert k.name == acdc_name("L0H0", "L1H0", "K")
    # its values read the token block, which the previous-token head does not write
    assert edge(circuit_graph(model, repeated(model), {}), "L0H0", "L1H0", "V") is None
    model = pointer_arithmetic_model().double()
    q = edge(circuit_graph(model, repeated(model), {}), "L0H0", "L1H0", "Q")
    assert q.weight == pytest.approx(1.0, abs=1e-3) and q.parts["L0H0.pos"] == pytest.approx(q.weight)
    model = two_back_model().double()
    v = edge(circuit_graph(model, repeated(model), {}), "L0H0", "L1H0", "V")
    assert v.weight == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("positions", ["shortformer", "standard"])
@pytest.mark.parametrize("variant", [{}, {"normalization": "LN"}, {"normalization": "LN", "d_mlp": 8}])
def test_every_side_sums_to_one(positions, variant):
    model = float64_model(2, positions, biases=True, **variant)
    tokens = repeated(model, 3)
    frozen = freeze(model, tokens)
    parts = score_parts(model, tokens, "L1H1", frozen)
    for shares in (
        score_shares(parts, "Q"),
        score_shares(parts, "K"),
        value_shares(model, tokens, "L1H1", frozen),
    ):
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-10)


def test_the_weights_are_the_dense_shares():
    model = float64_model(2, "standard").requires_grad_(False)
    tokens = repeated(model, 3)
    frozen = freeze(model, tokens)
    edges = {(e.writer, e.kind): e.weight for e in reader_edges(model, tokens, "L1H0", frozen, 0.0)}
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[1].attn
    resid = cache[hook_name(1, "resid_pre")]
    q, k = resid @ attn.W_Q[0] / math.sqrt(model.cfg.d_head), resid @ attn.W_K[0]
    pattern, own = cache[hook_name(1, "pattern")][:, 0], cache[hook_name(1, "result")][:, :, 0]
    for w in range(model.cfg.n_heads):
        write = cache[hook_name(0, "result")][:, :, w]
        through = pattern @ write @ attn.W_V[0] @ attn.W_O[0]
        assert edges[(f"L0H{w}", "V")] == pytest.approx(
            float((through * own).sum() / own.square().sum()), abs=1e-10
        )
        q_w = write @ attn.W_Q[0] / math.sqrt(model.cfg.d_head)
        assert edges[(f"L0H{w}", "Q")] == pytest.approx(centred_share(q_w @ k.mT, q @ k.mT), abs=1e-10)
        assert edges[(f"L0H{w}", "K")] == pytest.approx(
            centred_share(q @ (write @ attn.W_K[0]).mT, q @ k.mT), abs=1e-10
        )


def definition_value_shares(model, tokens, reader, frozen) -> dict[str, float]:
    """Each part's ``<write_j, write> / |write|^2`` from the parts' writes formed in ``d_model``,
    in float64 (through a post-attention norm's frozen linear part where there is one)."""
    layer, index = parse_head(reader, model.cfg)
    attn = model.blocks[layer].attn
    model.requires_grad_(False)
    names, x = read_parts(
        model.blocks[layer].ln1,
        frozen.scales.get(norm_name(layer, "ln1")),
        stream_parts(model, tokens, layer, frozen),
    )
    writes = post_linear(
        model, frozen, layer, frozen.patterns[layer][:, index] @ x @ attn.W_V[index] @ attn.W_O[index], False
    )
    total = writes.sum(0)
    return {n: float((w * total).sum() / total.square().sum()) for n, w in zip(names, writes, strict=True)}


# gemma2 and olmo2: a norm after the attention, whose frozen linear part the shares go through
@pytest.mark.parametrize("name", ["llama", "gemma2", "olmo2"])
def test_value_shares_in_d_head_space_are_the_definition(tmp_path, name):
    random_hf_model(dict(family_configs())[name]).save_pretrained(tmp_path)
    model = qkov.open_model(tmp_path).double()
    tokens = repeated(model, 3)
    frozen = freeze(model, tokens)
    reader = head_name(1, 1)
    got, expected = (
        value_shares(model, tokens, reader, frozen),
        definition_value_shares(model, tokens, reader, frozen),
    )
    assert got.keys() == expected.keys() and len(got) > 2
    for part, share in expected.items():
        assert got[part] == pytest.approx(share, rel=1e-9, abs=1e-12), part
    assert max(abs(share) for share in expected.values()) > 1e-3


def test_a_norms_linear_part_and_its_adjoint_agree():
    cfg = qkov.Config(n_layers=1, n_heads=1, d_model=6, d_head=2, d_vocab=4, n_ctx=4)
    for norm in (LayerNorm(cfg, affine=True), RMSNorm(cfg, affine=True)):
        with torch.no_grad():
            norm.w.copy_(torch.randn(6))
        norm = norm.double()
        gen = torch.Generator().manual_seed(0)
        x, y = (torch.randn(4, 6, dtype=torch.float64, generator=gen) for _ in range(2))
        scale = torch.rand(4, 1, dtype=torch.float64, generator=gen) + 0.5
        left = (norm.linear(x, scale) * y).sum(-1)
        torch.testing.assert_close(left, (x * norm.linear_adjoint(y, scale)).sum(-1), rtol=1e-12, atol=1e-12)


def test_the_threshold_keeps_only_large_edges():
    model = induction_model().double()
    circuit = circuit_graph(model, repeated(model), {}, threshold=0.3)
    assert circuit.threshold == 0.3 and all(abs(e.weight) >= 0.3 for e in circuit.edges)
    assert len(circuit.edges) < len(circuit_graph(model, repeated(model), {}, threshold=0.0).edges)


def test_the_step_reads_the_roles_and_round_trips():
    model = with_recent_head(induction_model(n_ctx=16)).double()
    circuit = run_steps(model, ["circuit"])["circuit"]
    roles = {node.head: node.roles for node in circuit.nodes}
    assert "previous_token" in roles["L0H0"] and "several_recent_tokens" in roles["L0H1"]
    assert {"induction", "copying"} <= set(roles["L1H0"])
    into = [e for e in circuit.edges if e.reader == "L1H0"]  # the recency term takes the rest
    assert max(into, key=lambda e: e.weight) == edge(circuit, "L0H0", "L1H0", "K")
    adapter = TypeAdapter(Circuit)
    assert adapter.validate_json(adapter.dump_json(circuit)) == circuit


def test_the_parts_scored_a_few_at_a_time_give_the_same_shares(monkeypatch):
    """Within ``SHARE_BYTES`` the parts' score terms are made a few at a time (one, at a budget of one
    byte): every share is the one made with all parts at once."""
    from qkov.circuits import circuit

    model = float64_model(2, "standard").requires_grad_(False)
    tokens = repeated(model, 3)
    frozen = freeze(model, tokens)
    whole = {(e.writer, e.kind): e.weight for e in reader_edges(model, tokens, "L1H0", frozen, 0.0)}
    monkeypatch.setattr(circuit, "SHARE_BYTES", 1)
    cut = {(e.writer, e.kind): e.weight for e in reader_edges(model, tokens, "L1H0", frozen, 0.0)}
    assert cut.keys() == whole.keys()
    assert all(cut[key] == pytest.approx(whole[key], abs=1e-12) for key in whole)


@pytest.mark.parametrize("positional_embedding", ["shortformer", "standard", "rotary"])
def test_one_read_per_layer_serves_each_reader_as_its_own_read_would(positional_embedding):
    """The graph forms each layer's read of the stream's parts once for all its readers
    (:func:`~qkov.circuits.attribution.layer_read`): its edges equal those of each reader reading
    on its own, with every share kept (threshold 0). A shortformer's ``pos_embed`` part, added per
    reader, must not be added to the layer's list of parts for the next."""
    model = float64_model(3, positional_embedding, seed=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(5))
    frozen = freeze(model, tokens)
    alone = [
        edge
        for layer in range(1, 3)
        for h in range(model.cfg.n_heads)
        for edge in reader_edges(model, tokens, head_name(layer, h), frozen, 0.0)
    ]
    assert circuit_graph(model, tokens, {}, threshold=0.0).edges == alone
