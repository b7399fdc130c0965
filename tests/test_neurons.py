"""MLP neurons as keys and values: the streamed top tokens against the dense float64 products on
the folded weights, the last MLP's exact split against the model's logits and path expansion (with
and without LayerNorm and biases), a hand-built neuron whose key and value are known, and the step."""

from __future__ import annotations

import pytest
import torch

from qkov.analyze import STEPS, analyze
from qkov.circuits.neurons import (
    DATA_RANKING,
    WEIGHT_RANKING,
    mlp_logit_terms,
    neuron_analysis,
    neuron_keys,
    neuron_logit_contributions,
    neuron_logit_effects,
    neuron_values,
    next_token_targets,
    target_contributions,
)
from qkov.circuits.paths import path_expansion
from qkov.data.user_tokens import IGNORE
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model

from conftest import float64_model, small_config, tokens_for
from handbuilt import neuron_model

STYLES = [("LN", False), ("LN", True), ("LNPre", False), ("none", True), ("none", False)]


def mlp_model(normalization="LN", biases=False, n_layers=2, seed=0):
    return float64_model(
        n_layers,
        "standard",
        biases=biases,
        seed=seed,
        normalization=normalization,
        d_mlp=12,
        act_fn="gelu_new",
    )


@pytest.mark.parametrize(("normalization", "biases"), STYLES)
def test_keys_and_values_are_the_top_entries_of_the_dense_folded_products(normalization, biases):
    model = mlp_model(normalization, biases)
    folded = circuit_model(model)
    for layer in range(2):
        mlp = folded.blocks[layer].mlp
        keys = folded.W_E @ mlp.W_in  # [d_vocab, d_mlp]
        values = mlp.W_out @ folded.W_U  # [d_mlp, d_vocab]
        got, ids = neuron_keys(model, layer, k=4)
        want = keys.T.topk(4, dim=-1)
        torch.testing.assert_close(got, want.values, rtol=0, atol=1e-12)
        assert torch.equal(ids, want.indices)
        for largest in (True, False):
            got, ids = neuron_values(model, layer, torch.tensor([3, 0, 7]), k=5, largest=largest)
            want = values[[3, 0, 7]].topk(5, dim=-1, largest=largest)
            torch.testing.assert_close(got, want.values, rtol=0, atol=1e-12)
            assert torch.equal(ids, want.indices)
        rms = values.square().mean(-1).sqrt()
        torch.testing.assert_close(neuron_logit_effects(model)[layer], rms, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("normalization", "biases"), STYLES)
@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_the_last_mlp_split_sums_to_the_logits_and_matches_path_expansion(normalization, biases, n_layers):
    model = mlp_model(normalization, biases, n_layers, seed=n_layers)
    tokens = tokens_for(model)
    terms = mlp_logit_terms(model, tokens)
    assert set(terms) == {"before", "neurons", "b_out", "constant"}
    logits = model(tokens).detach()
    torch.testing.assert_close(sum(terms.values()), logits, rtol=1e-10, atol=1e-10)
    each = neuron_logit_contributions(model, tokens)  # [batch, pos, d_mlp, d_vocab]
    torch.testing.assert_close(each.sum(2), terms["neurons"], rtol=1e-10, atol=1e-10)
    # the last MLP's path-expansion term is its neurons plus b_out, each with ln_final's scale frozen
    last = path_expansion(model, tokens)[(f"L{n_layers - 1}MLP",)]
    torch.testing.assert_close(terms["neurons"] + terms["b_out"], last, rtol=1e-10, atol=1e-10)
    if not biases:
        assert not terms["b_out"].any()
    if normalization == "none" and not biases:
        assert not terms["constant"].any()


def test_each_neuron_contribution_is_its_activation_times_its_value_through_the_frozen_norm():
    """A dense reference written out: the activation from a plain forward of the last block's
    MLP, divided by ln_final's scale, times the centred, weighted value row, times W_U."""
    model = mlp_model("LN", biases=True)
    tokens = tokens_for(model, batch=2)
    _, cache = model.run_with_cache(tokens)
    mlp, ln2 = model.blocks[1].mlp, model.blocks[1].ln2
    post = mlp.act(ln2(cache["blocks.1.hook_resid_mid"]) @ mlp.W_in + mlp.b_in)
    scale = cache["ln_final.hook_scale"]
    value = (mlp.W_out - mlp.W_out.mean(-1, keepdim=True)) * model.ln_final.w
    for n in (0, 5, 11):
        want = (post[..., n, None] / scale) * (value[n] @ model.W_U)
        got = neuron_logit_contributions(model, tokens, [n])[:, :, 0]
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    targets = next_token_targets(tokens)
    per_target = target_contributions(model, tokens, targets)
    full = neuron_logit_contributions(model, tokens)
    want = full.gather(-1, targets.clamp_min(0)[:, :, None, None].expand(-1, -1, 12, 1))[..., 0]
    want[targets == IGNORE] = 0
    torch.testing.assert_close(per_target, want, rtol=1e-12, atol=1e-12)


def test_a_hand_built_neuron_has_the_planted_key_and_value():
    model = neuron_model()
    keys, ids = neuron_keys(model, 0, [2], k=2)
    assert ids.tolist() == [[5, 1]] and keys.tolist() == [[3.0, 0.75]]
    up, raised = neuron_values(model, 0, [2], k=1)
    down, lowered = neuron_values(model, 0, [2], k=1, largest=False)
    assert (raised.tolist(), up.tolist(), lowered.tolist(), down.tolist()) == (
        [[7]],
        [[3.0]],
        [[3]],
        [[-2.0]],
    )
    # on "5 7": neuron 2 fires 3.0 at token 5 and writes 3 x 3.0 into the logit of 7, its target
    tokens = torch.tensor([[5, 7]])
    contributions = target_contributions(model, tokens, next_token_targets(tokens))
    assert contributions[0, 0].tolist() == [0.0, 0.0, 9.0, 0.0] and not contributions[0, 1].any()
    # on "5 7 2": 9 at the first position, 0 at the second (token 7 does not excite it), no target
    # at the last: a mean of 4.5 over the two positions with a target, and of activation 1.5
    result = neuron_analysis(model, torch.tensor([[5, 7, 2]]), "5 7 2", k=2, top=2)
    (layer,) = result.layers
    best = layer.neurons[0]
    assert layer.ranked_by == DATA_RANKING and best.neuron == 2 and best.excited_by == [5, 1]
    assert best.on_data.target_logit == 4.5 and best.on_data.mean_activation == 1.5
    assert result.data == "5 7 2" and result.max_error == 0.0
    weights_only = neuron_analysis(model, k=2, top=1)
    assert (
        weights_only.layers[0].ranked_by == WEIGHT_RANKING and weights_only.layers[0].neurons[0].neuron == 2
    )
    assert weights_only.data is None and weights_only.max_error is None


def test_bad_input_is_one_clear_error():
    with pytest.raises(QkovError, match="no MLPs"):
        neuron_keys(float64_model(2, "standard"), 0)
    model = mlp_model()
    with pytest.raises(QkovError, match="layer 2 out of range"):
        neuron_values(model, 2)
    with pytest.raises(QkovError, match=r"neuron ids must lie in \[0, 12\)"):
        neuron_keys(model, 0, [12])


def test_the_step_runs_for_mlp_models_and_says_why_not_for_attention_only_ones():
    step = next(s for s in STEPS if s.name == "neurons")
    assert (
        step.skip_reason(small_config(2), has_corpus=False)
        == "needs MLPs: the model is attention-only (d_mlp 0)"
    )
    model = mlp_model("LN", biases=True).float()
    results = analyze(model, show_progress=False)
    neurons = results.neurons
    assert [layer.ranked_by for layer in neurons.layers] == [WEIGHT_RANKING, DATA_RANKING]
    assert neurons.k == 10 and neurons.top == 10 and neurons.data.startswith("repeated random tokens")
    assert neurons.max_error < 1e-4
    first = neurons.layers[0].neurons
    effects = [n.logit_effect for n in first]
    assert effects == sorted(effects, reverse=True) and len(first) == 10
    assert [n.neuron for n in first] == neuron_logit_effects(model)[0].topk(10).indices.tolist()
    last = [n.on_data.target_logit_abs for n in neurons.layers[1].neurons]
    assert last == sorted(last, reverse=True)
