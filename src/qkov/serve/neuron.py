"""The view of one MLP neuron (the paper's MLP section: a neuron's key is a column of ``W_in``, its
value a row of ``W_out``): the tokens whose embedding most excites it and the tokens whose logits its
write most raises and lowers, over the whole vocabulary, read through the direct path on the folded
weights by the functions ``qkov analyze`` uses (:mod:`qkov.circuits.neurons`), and its layer's
neurons of the largest direct logit effect to pick from."""

from __future__ import annotations

from qkov.circuits.neurons import neuron_keys, neuron_logit_effects, neuron_values
from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Progress

TOP_LISTED = 12  # the layer's neurons offered to pick from


def check_neuron(ex: Explorer, layer: int, neuron: int) -> None:
    """Refuse, in one line, a model without MLPs or a layer or neuron out of range."""
    cfg = ex.cfg
    if not cfg.has_mlp:
        raise QkovError("the model has no MLPs (attention-only): it has no neurons")
    if not 0 <= layer < cfg.n_layers:
        raise QkovError(f"layer {layer} out of range: the model has layers 0 to {cfg.n_layers - 1}")
    if not 0 <= neuron < cfg.d_mlp:
        raise QkovError(f"neuron {neuron} out of range: each MLP has neurons 0 to {cfg.d_mlp - 1}")


def neuron_view(ex: Explorer, layer: int, neuron: int, k: int, progress: Progress) -> dict:
    """One neuron's key tokens (pre-activation from the token's embedding alone), the tokens it
    raises and lowers (logits per unit of activation), its direct logit effect and rank in its
    layer, and the layer's neurons of the largest effect."""
    progress.step(0, 2, "every neuron's direct logit effect")
    effects = ex.once("neuron_logit_effects", lambda: neuron_logit_effects(ex.circuit))[layer]
    progress.step(1, 2, "the neuron's rows over the vocabulary")
    keys, key_ids = neuron_keys(ex.circuit, layer, [neuron], k)
    up, up_ids = neuron_values(ex.circuit, layer, [neuron], k)
    down, down_ids = neuron_values(ex.circuit, layer, [neuron], k, largest=False)
    top = effects.topk(min(TOP_LISTED, len(effects)))
    return {
        "layer": layer,
        "neuron": neuron,
        "logit_effect": float(effects[neuron]),
        "rank": int((effects > effects[neuron]).sum()) + 1,
        "excited_by": ex.listed(key_ids[0].tolist(), keys[0].tolist()),
        "raised": ex.listed(up_ids[0].tolist(), up[0].tolist()),
        "lowered": ex.listed(down_ids[0].tolist(), down[0].tolist()),
        "top_neurons": [
            {"neuron": n, "logit_effect": v}
            for n, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)
        ],
    }
