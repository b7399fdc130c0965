"""Virtual weights, frozen attention, path expansion and term importance against dense float64
computations and the independent reference model, for attention-only and GPT-2-style models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkov
from qkov.circuits import paths
from qkov.names import head_name

from conftest import float64_model, random_model, small_config, tokens_for
from handbuilt import two_back_model
from reference import reference_forward


# -- virtual weights ---------------------------------------------------------------------------
def test_virtual_weights_are_writer_output_times_reader_input():
    model = float64_model(2, "standard")
    b0, b1 = model.blocks[0].attn, model.blocks[1].attn
    cases = {
        ("embed", "L0H1.Q"): model.W_E @ b0.W_Q[1],
        ("pos", "L1H2.K"): model.W_pos @ b1.W_K[2],
        ("L0H2", "L1H0.V"): b0.W_O[2] @ b1.W_V[0],
        ("L1H1", "unembed"): b1.W_O[1] @ model.W_U,
        ("embed", "unembed"): model.W_E @ model.W_U,
    }
    for (writer, reader), dense in cases.items():
        torch.testing.assert_close(qkov.virtual_weights(model, writer, reader).AB, dense)


@pytest.mark.parametrize(
    ("scheme", "writer", "reader", "message"),
    [
        ("standard", "L1H0", "L1H1.Q", "does not write before"),
        ("standard", "L1H0", "L0H1.K", "does not write before"),
        ("standard", "L0H0", "L1H1.X", "'.K' or '.V'"),
        ("standard", "L5H0", "unembed", "no head L5H0"),
        ("standard", "head", "unembed", "not a head name"),
        ("shortformer", "pos", "L1H0.V", "only the queries and keys"),
        ("none", "pos", "L1H0.Q", "no positional embedding"),
    ],
)
def test_virtual_weights_reject_what_does_not_exist(scheme, writer, reader, message):
    with pytest.raises(qkov.QkovError, match=message):
        qkov.virtual_weights(float64_model(2, scheme), writer, reader)


# -- path expansion ----------------------------------------------------------------------------
@pytest.mark.parametrize("n_layers", [0, 1, 2, 3])
@pytest.mark.parametrize("scheme", ["shortformer", "standard"])
@pytest.mark.parametrize("biases", [False, True])
def test_path_terms_sum_to_the_logits_in_float64(n_layers, scheme, biases):
    model = float64_model(n_layers, scheme, biases=biases)
    tokens = tokens_for(model)
    terms = qkov.path_expansion(model, tokens)
    paths = [key for key in terms if key != "bias"]
    assert len(paths) == (model.cfg.n_heads + 1) ** n_layers
    assert ("bias" in terms) == biases
    total = sum(terms.values())
    torch.testing.assert_close(total, model(tokens), rtol=1e-10, atol=1e-10)
    by_order = qkov.path_expansion(model, tokens, by="order")
    assert [k for k in by_order if k != "bias"] == list(range(n_layers + 1))
    for order in range(n_layers + 1):
        torch.testing.assert_close(
            by_order[order],
            sum(t for p, t in terms.items() if p != "bias" and len(p) == order),
            rtol=1e-10,
            atol=1e-10,
        )


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_path_terms_sum_to_the_logits_in_float32(n_layers):
    model = random_model(small_config(n_layers, "shortformer"), seed=3)
    tokens = tokens_for(model)
    total = sum(qkov.path_expansion(model, tokens).values())
    logits = model(tokens).detach()
    assert float((total - logits).abs().max() / logits.abs().max()) < 1e-5


def test_a_virtual_head_term_is_its_two_patterns_and_two_ov_circuits():
    """The term of ("L0H1", "L2H0") computed by hand from the reference model's patterns."""
    model = float64_model(3, "standard")
    tokens = tokens_for(model)
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    _, patterns, _, _ = reference_forward(w, model.cfg, tokens.numpy())
    x = w["W_E"][tokens.numpy()] + w["W_pos"][:10]
    a0, a2 = patterns[0][:, 1], patterns[2][:, 0]  # [batch, dest, src]
    ov0 = w["blocks.0.attn.W_V"][1] @ w["blocks.0.attn.W_O"][1]
    ov2 = w["blocks.2.attn.W_V"][0] @ w["blocks.2.attn.W_O"][0]
    expected = a2 @ a0 @ x @ ov0 @ ov2 @ w["W_U"]
    term = qkov.path_expansion(model, tokens)[("L0H1", "L2H0")]
    np.testing.assert_allclose(term.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_frozen_logits_are_linear_in_the_embedding():
    """With patterns frozen, doubling the embedding doubles every path term (no bias)."""
    model = float64_model(2)
    tokens = tokens_for(model)
    patterns = qkov.frozen_patterns(model, tokens)
    before = qkov.path_expansion(model, tokens, patterns=patterns)
    with torch.no_grad():
        model.W_E.mul_(2.0)
    after = qkov.path_expansion(model, tokens, patterns=patterns)
    for path, term in before.items():
        torch.testing.assert_close(after[path], 2 * term, rtol=1e-12, atol=1e-12)


def test_path_expansion_rejects_a_bad_grouping_and_long_sequences():
    model = float64_model(1)
    with pytest.raises(qkov.QkovError, match="'path' or 'order'"):
        qkov.path_expansion(model, tokens_for(model), by="head")
    with pytest.raises(qkov.QkovError, match="longer than the context"):
        qkov.path_expansion(model, torch.zeros(1, 11, dtype=torch.long))


# -- term importance ---------------------------------------------------------------------------
def ce(logits, tokens):
    return float(F.cross_entropy(logits.detach()[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()))


@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("biases", [False, True])
def test_term_importance_equals_the_loss_of_path_sums_by_order(n_layers, biases):
    model = float64_model(n_layers, "standard", biases=biases, seed=n_layers)
    tokens = tokens_for(model, batch=4)
    result = qkov.term_importance(model, tokens)
    assert result.loss_by_order[-1] == pytest.approx(ce(model(tokens).detach(), tokens), rel=1e-10)
    if biases:  # b_U joins the direct path; b_V and b_O count with the head or layer that adds them
        assert result.loss_by_order[0] == pytest.approx(
            ce(model.unembed(model.embed(tokens)[0]).detach(), tokens)
        )
        return
    terms = qkov.path_expansion(model, tokens)
    for order in range(n_layers + 1):
        kept = sum(t for p, t in terms.items() if len(p) <= order)
        assert result.loss_by_order[order] == pytest.approx(ce(kept, tokens), rel=1e-10)
    assert result.loss_by_order[-1] == pytest.approx(ce(model(tokens), tokens), rel=1e-10)
    assert result.marginal == pytest.approx(np.diff(result.loss_by_order) * -1, rel=1e-12)
    direct = terms[()]
    for layer, head in itertools.product(range(n_layers), range(3)):
        with_head = ce(direct + terms[(head_name(layer, head),)], tokens)
        assert result.first_order_by_head[layer][head] == pytest.approx(
            ce(direct, tokens) - with_head, rel=1e-10
        )
    for layer in range(n_layers):
        with_layer = direct + sum(terms[(head_name(layer, h),)] for h in range(3))
        assert result.first_order_by_layer[layer] == pytest.approx(
            ce(direct, tokens) - ce(with_layer, tokens)
        )


def test_term_importance_keeps_each_sequences_loss_by_order():
    """The per-sequence losses are each sequence's own cross-entropy with the paths up to each order
    kept, and ``loss_by_order`` their mean weighted by the tokens scored; a sequence whose targets
    are all ignored is left out (with targets, a task's own)."""
    model = float64_model(2, seed=5)
    tokens = tokens_for(model, batch=3)
    result = qkov.term_importance(model, tokens)
    terms = qkov.path_expansion(model, tokens)
    for order in range(3):
        kept = sum(t for p, t in terms.items() if len(p) <= order)
        each = [ce(kept[i : i + 1], tokens[i : i + 1]) for i in range(3)]
        assert result.loss_by_order_by_sequence[order] == pytest.approx(each, rel=1e-10)
    assert result.scored_by_sequence == [tokens.shape[1] - 1] * 3
    targets = torch.full_like(tokens, -100)
    targets[0, -1], targets[2, 2:5] = tokens[0, 0], tokens[2, 1:4]
    masked = qkov.term_importance(model, tokens, targets=targets)
    assert masked.scored_by_sequence == [1, 3]
    by_sequence = np.array(masked.loss_by_order_by_sequence)
    assert by_sequence @ np.array([1, 3]) / 4 == pytest.approx(masked.loss_by_order, rel=1e-12)


def test_term_importance_needs_two_tokens():
    model = float64_model(1)
    with pytest.raises(qkov.QkovError, match="at least 2 tokens"):
        qkov.term_importance(model, torch.zeros(2, 1, dtype=torch.long))


def test_a_virtual_two_back_head_lives_in_a_second_order_path():
    """Two previous-token heads composed through their values predict the token two back; only
    the virtual head (L0H0, L1H0) carries it, and V-composition sees the pair."""
    model = two_back_model()
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 32, (4, 12), generator=gen)
    terms = qkov.path_expansion(model, tokens)
    virtual = terms[("L0H0", "L1H0")]
    assert torch.equal(virtual[:, 2:].argmax(-1), tokens[:, :-2])
    assert float(terms[("L1H0",)].abs().max()) < 0.1 * float(virtual.abs().max())
    v = qkov.composition_scores(model, "V", subtract_baseline=False)
    assert float(v[0, 0, 1, 0]) == pytest.approx(float(v[~v.isnan()].max()))
    # "a b c a b c ...": the token after position i is the one at i - 2
    period_three = torch.stack([torch.randperm(32, generator=gen)[:3] for _ in range(4)]).repeat(1, 4)
    importance = qkov.term_importance(model, period_three)
    assert importance.marginal[1] > 1.5  # the second-order term does the predicting
    assert abs(importance.marginal[0]) < 0.5


# -- GPT-2-style models: frozen LayerNorm scales and MLP writes ------------------------------------

GPT2_STYLE = [("LN", 0), ("LN", 24), ("LNPre", 24), ("none", 24), ("LNPre", 0)]


def heads_on(path):
    return sum(not name.endswith("MLP") for name in path)


@pytest.mark.parametrize(("normalization", "d_mlp"), GPT2_STYLE)
@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("biases", [False, True])
def test_gpt2_style_path_terms_sum_to_the_logits_in_float64(normalization, d_mlp, n_layers, biases):
    model = float64_model(
        n_layers, "standard", biases=biases, seed=n_layers, normalization=normalization, d_mlp=d_mlp
    )
    tokens = tokens_for(model)
    logits = model(tokens)
    terms = qkov.path_expansion(model, tokens)
    n_paths = sum((3 + 1) ** (n_layers - layer - 1) for layer in range(n_layers)) if d_mlp else 0
    assert len(terms) == 4**n_layers + n_paths + (biases or normalization == "LN")
    torch.testing.assert_close(sum(terms.values()), logits, rtol=1e-10, atol=1e-10)
    by_order = qkov.path_expansion(model, tokens, by="order")
    torch.testing.assert_close(sum(by_order.values()), logits, rtol=1e-10, atol=1e-10)
    if d_mlp:
        mlp = sum(t for p, t in terms.items() if p != "bias" and p and p[0].endswith("MLP"))
        torch.testing.assert_close(by_order["mlp"], mlp, rtol=1e-10, atol=1e-10)
    if normalization != "none":  # the direct path, written out: the final LayerNorm's linear part
        _, cache = model.run_with_cache(tokens)
        x = model.embed(tokens)[0]
        x = (x - x.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"]
        x = x * model.ln_final.w if normalization == "LN" else x
        torch.testing.assert_close(terms[()], x @ model.W_U, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d_mlp", [0, 24])
@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_gpt2_style_term_importance_equals_the_loss_of_path_sums(d_mlp, n_layers):
    """LNPre without biases: no constant term, so each order's loss is that of a sum of paths
    (orders count heads; MLP writes are kept at every order)."""
    model = float64_model(n_layers, "standard", seed=n_layers, normalization="LNPre", d_mlp=d_mlp)
    tokens = tokens_for(model, batch=4)
    result = qkov.term_importance(model, tokens)
    assert result.loss_by_order[-1] == pytest.approx(ce(model(tokens), tokens), rel=1e-10)
    terms = qkov.path_expansion(model, tokens)
    for order in range(n_layers + 1):
        kept = sum(t for p, t in terms.items() if heads_on(p) <= order)
        assert result.loss_by_order[order] == pytest.approx(ce(kept, tokens), rel=1e-10)


@pytest.mark.parametrize("blocks", [(paths.ROWS, paths.COLUMNS), (3, 7)])
@pytest.mark.parametrize("reach", [paths.REACH, -1.0])
@pytest.mark.parametrize("normalization", ["LN", "LNPre", "none"])
def test_first_order_terms_through_rank_d_head_products_are_the_unembedded_writes(
    normalization, reach, blocks, monkeypatch
):
    """Each head's (and layer's) first-order loss, read through ``LN_lin(W_O^h) @ W_U`` with the
    final scale frozen, equals the definition: the direct path's stream plus the head's write,
    unembedded whole (LayerNorm's ``b``, MLPs and biases included), in float64; summed in exp
    space (every head here is within ``REACH``) and by ``logsumexp`` (``REACH`` below zero); in
    one block of rows and columns, and in blocks of 3 x 7 (the last one narrower: the scratch
    reused from block to block)."""
    monkeypatch.setattr(paths, "REACH", reach)
    monkeypatch.setattr(paths, "ROWS", blocks[0])
    monkeypatch.setattr(paths, "COLUMNS", blocks[1])
    cfg = small_config(3, "standard", normalization=normalization, d_mlp=8)
    model = random_model(cfg, biases=True, seed=4).double()
    tokens = tokens_for(model, batch=4)
    result = qkov.term_importance(model, tokens)
    frozen = paths.freeze(model, tokens)
    base, inputs, _ = paths._rerun(model, frozen, model.embed(tokens)[0], None)

    def loss(resid):
        return ce(paths._unembed_affine(model, frozen, resid), tokens)

    for layer in range(3):
        writes = paths._head_writes(model, frozen, layer, inputs[layer])
        whole = loss(base) - loss(base + writes.sum(2))
        assert result.first_order_by_layer[layer] == pytest.approx(whole, rel=1e-10, abs=1e-12)
        for head in range(3):
            alone = loss(base) - loss(base + writes[:, :, head])
            assert result.first_order_by_head[layer][head] == pytest.approx(alone, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("by", ["path", "order"])
def test_path_expansion_makes_no_tensor_without_saying_where(by):
    """On a GPU, a term made on the default device would meet the model's (see
    ``test_no_step_makes_a_tensor_without_saying_where``): with the default device ``meta``, the
    expansion of a model with biases, LayerNorm and MLPs is the same as without."""
    cfg = small_config(normalization="LN", d_mlp=8, act_fn="gelu_new")
    model = random_model(cfg, biases=True).double()
    tokens = tokens_for(model)
    expected = qkov.path_expansion(model, tokens, by=by)
    with torch.device("meta"):
        got = qkov.path_expansion(model, tokens, by=by)
    assert got.keys() == expected.keys() and "bias" in got
    for key, term in expected.items():
        assert torch.equal(got[key], term), key
