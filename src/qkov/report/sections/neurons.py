"""MLP neurons as keys and values, and the last MLP's direct logit split."""

from __future__ import annotations

from qkov.circuits.neurons import LayerNeurons
from qkov.report.markup import Raw, figure, table, tok
from qkov.report.svg import esc
from qkov.results import Results

NEURON_TOKENS_SHOWN = 5  # tokens per list in the report (results.json keeps k)


def _neuron_tokens(ids: list[int], strings: list[str]) -> Raw:
    return Raw(" ".join(str(tok(strings[i])) for i in ids[:NEURON_TOKENS_SHOWN]))


def _neuron_table(layer: LayerNeurons, strings: list[str]) -> str:
    on_data = layer.neurons and layer.neurons[0].on_data is not None
    gated = layer.neurons and layer.neurons[0].gated_by is not None
    header = (
        ["neuron", "logit effect", "excited by"]
        + (["gate opened by"] if gated else [])
        + ["raises", "lowers"]
    )
    header += ["mean activation", "target logit", "|target logit|"] if on_data else []
    rows = []
    for n in layer.neurons:
        row = [f"L{n.layer}N{n.neuron}", n.logit_effect]
        keys = (n.excited_by, n.gated_by) if n.gated_by is not None else (n.excited_by,)
        row += [_neuron_tokens(ids, strings) for ids in (*keys, n.raises, n.lowers)]
        if n.on_data is not None:
            row += [n.on_data.mean_activation, n.on_data.target_logit, n.on_data.target_logit_abs]
        rows.append(row)
    return f"<h4>Layer {layer.layer}: ranked by {esc(layer.ranked_by)}</h4>" + table(header, rows)


def neurons_section(r: Results) -> str:
    neurons = r.neurons
    if neurons is None:
        return ""
    data = (
        f" The last layer on {neurons.data}: each neuron's exact direct contribution to the target "
        f"logit (its activation times W_out[n] through ln_final at its frozen scale and W_U), averaged "
        f"over positions; with the rest of the logits it sums to the model's to {neurons.max_error:.1e}."
        if neurons.data is not None
        else ""
    )
    return figure(
        "".join(_neuron_table(layer, r.tokens) for layer in neurons.layers),
        f"Each MLP layer's top {neurons.top} neurons read through the direct path, on the LayerNorm-folded "
        "weights at unit LayerNorm scale: the tokens whose embedding most excites the neuron (its key: "
        "W_E W_in[:, n]; in a gated MLP also the tokens that most open its gate, W_E W_gate[:, n]) and "
        "the tokens whose logits its write most raises and lowers (its value: "
        f"W_out[n] W_U), {NEURON_TOKENS_SHOWN} of the {neurons.k} in results.json. Logit effect: the "
        "root mean square over the vocabulary of W_out[n] W_U." + data,
        "MLP neurons can be read as keys (what they respond to) and values (what they write); in the "
        "last layer their effect on the logits is linear once the activations are given.",
    )
