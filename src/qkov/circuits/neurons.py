"""MLP neurons as keys and values, read off the weights (the paper's MLP section, and its open
question on MLPs: the last MLP layer's effect on the logits is linear once its activations are given).

A neuron ``n`` of the MLP of layer ``l`` reads the residual stream through its *key*, column ``n``
of ``W_in`` (``[d_model, d_mlp]``), and writes its activation times its *value*, row ``n`` of
``W_out`` (``[d_mlp, d_model]``): ``MLP(x) = Σ_n act(x W_in[:, n] + b_in[n]) W_out[n]`` (row vectors;
the paper, with column vectors, writes ``W_out act(W_in x)``). Read through the direct path:

- *keys*: the tokens whose embedding most excites the neuron, the largest entries of column ``n``
  of ``W_E W_in`` (``d_vocab x d_mlp``; the paper's ``W_in W_E``), the pre-activation a token's
  embedding alone gives; positions, attention and ``b_in`` (the same for every token) left out;
- *values*: the tokens whose logits its write most raises and lowers, row ``n`` of ``W_out W_U``
  (``d_mlp x d_vocab``; the paper's ``W_U W_out``), per unit of activation.

Both read the LayerNorm-folded weights (:func:`qkov.interop.fold.circuit_model`): ``ln2``'s ``w``
inside ``W_in``, ``ln_final``'s inside ``W_U``, everything that writes centred, ``W_U`` centred over
the vocabulary. What no weight holds is the LayerNorm scale, one positive number per position,
frozen here at 1 for every token as the other weight-based circuits do: rankings within a neuron
are exact (one position's scale divides every token alike), magnitudes are per unit of scale.
Neither product is built: each neuron's row is streamed over the vocabulary
(:meth:`qkov.FactoredMatrix.topk_per_row`, a block of at most 16 MiB at a time).

The neurons of a layer are ranked by their direct logit effect ``||W_out[n] W_U|| / sqrt(d_vocab)``
(root mean square over the vocabulary of the centred logits a unit activation writes), exact from
the ``d_model x d_model`` Gram matrix ``W_U W_U^T`` without any vocabulary-long product.

The last MLP: with ``ln_final``'s scale ``s`` frozen at its value on the data (as path expansion
freezes it, :mod:`qkov.circuits.paths`), the logits are exactly

    logits = LN_lin(resid_mid) W_U + LN_lin(b_out) W_U + Σ_n a_n LN_lin(W_out[n]) W_U + (b W_U + b_U)

with ``resid_mid`` the stream before the last MLP (every other path), ``a_n`` the neuron's
activation and ``LN_lin(x) = (x - mean(x)) / s * w``: :func:`mlp_logit_terms` returns those four
terms, :func:`neuron_logit_contributions` each neuron's own term ``[batch, pos, neurons, d_vocab]``.
They are read on the model itself (not folded), so they sum to its logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

from qkov.circuits.budget import forward_flop
from qkov.config import Config
from qkov.data.user_tokens import IGNORE
from qkov.errors import QkovError
from qkov.interop.fold import circuit_model
from qkov.linalg import FactoredMatrix, outer_root
from qkov.model import AttnOnlyTransformer, normalized
from qkov.names import hook_name, norm_name, scale_hook

TOKENS_K = 10  # tokens per list: the keys, the raised and the lowered
TOP_NEURONS = 10  # neurons kept per layer in the results
WEIGHT_RANKING = "direct logit effect ||W_out[n] W_U|| / sqrt(d_vocab) (weights)"
DATA_RANKING = "mean |direct contribution to the target's logit| on the data"


@dataclass(frozen=True)
class NeuronOnData:
    """A last-layer neuron on the data: its mean activation, and its exact direct contribution to
    the logit of each position's target, averaged (``target_logit``) and averaged in absolute value
    (``target_logit_abs``, the ranking), over the positions that have a target."""

    mean_activation: float
    target_logit: float
    target_logit_abs: float


@dataclass(frozen=True)
class Neuron:
    """One neuron read through the direct path (see the module docstring): the ``k`` tokens whose
    embedding most excites it (``excited_by``, pre-activations ``excitation``), the tokens its write
    most raises and lowers (``raises`` / ``raised``, ``lowers`` / ``lowered``, logits per unit of
    activation), its direct logit effect ``logit_effect`` (the ranking), and, in the last layer
    with data, ``on_data``. In a gated MLP (``act(x W_gate) * (x W_in)``) a neuron has two key
    directions: ``excited_by`` reads ``W_E W_in`` (what its value is multiplied by) and ``gated_by`` /
    ``gating`` the tokens whose embedding most opens its gate (``W_E W_gate``, before ``act``)."""

    layer: int
    neuron: int
    logit_effect: float
    excited_by: list[int]
    excitation: list[float]
    raises: list[int]
    raised: list[float]
    lowers: list[int]
    lowered: list[float]
    on_data: NeuronOnData | None = None
    gated_by: list[int] | None = None
    gating: list[float] | None = None


@dataclass(frozen=True)
class LayerNeurons:
    """A layer's top neurons, best first, and what ranked them."""

    layer: int
    ranked_by: str
    neurons: list[Neuron]


@dataclass(frozen=True)
class Neurons:
    """Every MLP layer's ``top`` neurons with ``k`` tokens per list. ``data`` describes what the last
    layer's direct logit contributions were measured on (None without data), and ``max_error`` is
    the largest ``|Σ terms - logits|`` of the exact split (:func:`mlp_logit_terms`) there."""

    k: int
    top: int
    layers: list[LayerNeurons]
    data: str | None
    max_error: float | None


def _mlp(model: AttnOnlyTransformer, layer: int):
    if not model.cfg.has_mlp:
        raise QkovError("the model has no MLPs (attention-only): it has no neurons")
    if not 0 <= layer < model.cfg.n_layers:
        raise QkovError(f"layer {layer} out of range: the model has layers 0 to {model.cfg.n_layers - 1}")
    return model.blocks[layer].mlp


def _neuron_ids(model: AttnOnlyTransformer, neurons: Int[Tensor, "n"] | list[int] | None) -> Tensor:
    d_mlp, device = model.cfg.d_mlp, model.device
    if neurons is None:
        return torch.arange(d_mlp, device=device)
    ids = torch.as_tensor(neurons, dtype=torch.long, device=device).reshape(-1)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= d_mlp):
        raise QkovError(f"neuron ids must lie in [0, {d_mlp}), got {ids.tolist()[:5]}...")
    return ids


def neuron_keys(
    model: AttnOnlyTransformer, layer: int, neurons: Int[Tensor, "n"] | None = None, k: int = TOKENS_K
) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """For each neuron, the ``k`` tokens whose embedding most excites it and their pre-activations:
    the largest entries of its column of ``W_E W_in`` (folded weights, unit scale), streamed."""
    return _keys(model, layer, neurons, k, "W_in")


def _keys(model: AttnOnlyTransformer, layer: int, neurons, k: int, weight: str):
    circuit = circuit_model(model)
    ids = _neuron_ids(circuit, neurons)
    keys = getattr(_mlp(circuit, layer), weight).detach().T[ids]  # [n, d_model]
    return FactoredMatrix(keys, circuit.W_E.detach().T).topk_per_row(min(k, circuit.cfg.d_vocab))


def neuron_gates(
    model: AttnOnlyTransformer, layer: int, neurons: Int[Tensor, "n"] | None = None, k: int = TOKENS_K
) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """In a gated MLP, for each neuron the ``k`` tokens whose embedding most opens its gate: the
    largest entries of its column of ``W_E W_gate`` (folded weights, unit scale), streamed."""
    if not model.cfg.gated_mlp:
        raise QkovError("the model's MLPs are not gated: its neurons have no gate")
    return _keys(model, layer, neurons, k, "W_gate")


def neuron_values(
    model: AttnOnlyTransformer,
    layer: int,
    neurons: Int[Tensor, "n"] | None = None,
    k: int = TOKENS_K,
    largest: bool = True,
) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """For each neuron, the ``k`` tokens whose logits its write raises most (``largest=False``:
    lowers most) per unit of activation: its row of ``W_out W_U`` (folded weights), streamed."""
    circuit = circuit_model(model)
    ids = _neuron_ids(circuit, neurons)
    values = _mlp(circuit, layer).W_out.detach()[ids]  # [n, d_model]
    return FactoredMatrix(values, circuit.W_U.detach()).topk_per_row(
        min(k, circuit.cfg.d_out), largest=largest
    )


@torch.no_grad()
def neuron_logit_effects(model: AttnOnlyTransformer) -> Float[Tensor, "n_layers d_mlp"]:
    """Every neuron's direct logit effect ``||W_out[n] W_U|| / sqrt(d_vocab)`` on the folded weights
    (see the module docstring): ``||W_out[n] R^T||`` with ``R^T R = W_U W_U^T``
    (:func:`qkov.linalg.outer_root`, once for every layer), no ``d_mlp x d_vocab`` product."""
    circuit = circuit_model(model)
    _mlp(circuit, 0)
    root = outer_root(circuit.W_U.T)  # [k, d_model]
    # one layer's W_out at a time: a model read layer by layer never holds them all
    effects = [(block.mlp.W_out.detach() @ root.T).norm(dim=-1) for block in circuit.blocks]
    return torch.stack(effects) / circuit.cfg.d_out**0.5


# -- the last MLP on data: exact direct logit contributions -----------------------------------------
@dataclass(frozen=True)
class _LastMLP:
    """What the last MLP's split reads from one run: its logits, the stream before the last MLP, its
    activations, and ``ln_final``'s scale (None without LayerNorm)."""

    logits: Float[Tensor, "batch pos d_vocab"]
    resid_mid: Float[Tensor, "batch pos d_model"]
    post: Float[Tensor, "batch pos d_mlp"]
    scale: Float[Tensor, "batch pos 1"] | None


def _last_mlp_run(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> _LastMLP:
    last = model.cfg.n_layers - 1
    mlp = _mlp(model, last)
    tokens = model.check_tokens(tokens)
    # only what the split reads is kept: the whole cache would hold every head's write of every layer
    # (460 MB by the shapes at GPT-2 small's on 8 x 130 tokens)
    kept = {hook_name(last, point) for point in ("resid_pre", "resid_mid")}
    kept |= {scale_hook(norm_name(last, "ln2")), scale_hook(norm_name(None, "ln_final"))}
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=kept.__contains__)
        resid_mid = cache[hook_name(last, "resid_mid")]
        block = model.blocks[last]  # a parallel block's MLP reads the stream before its attention
        read = cache[hook_name(last, "resid_pre")] if block.parallel else resid_mid
        ln2 = block.ln2
        x = read if ln2 is None else ln2(read, cache[scale_hook(norm_name(last, "ln2"))])
        post = mlp.post(x)  # act(x W_in + b_in), or act(x W_gate + b_gate) * (x W_in + b_in) when gated
    scale = cache.get(scale_hook(norm_name(None, "ln_final")))
    return _LastMLP(logits, resid_mid, post, scale)


def _unembed_linear(model: AttnOnlyTransformer, x: Tensor, scale: Tensor | None) -> Tensor:
    """``LN_lin(x) W_U``: ``ln_final``'s linear part at a frozen scale (``x`` itself without it)."""
    return (x if model.ln_final is None else model.ln_final.linear(x, scale)) @ model.W_U


def _value_logits(model: AttnOnlyTransformer, ids: Tensor) -> Float[Tensor, "n d_model"]:
    """The neurons' values as ``ln_final``'s linear part reads them at unit scale: a position's
    frozen scale divides them all alike, so it is applied per position afterwards."""
    W_out = model.blocks[-1].mlp.W_out[ids]
    return W_out if model.ln_final is None else model.ln_final.linear(W_out, torch.ones_like(W_out[:, :1]))


def _per_scale(run: _LastMLP, ids: Tensor) -> Float[Tensor, "batch pos n"]:
    """Each neuron's activation over ``ln_final``'s frozen scale at its position."""
    post = run.post[..., ids]
    return post if run.scale is None else post / run.scale


def neuron_logit_contributions(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], neurons: Int[Tensor, "n"] | None = None
) -> Float[Tensor, "batch pos n d_vocab"]:
    """Each last-layer neuron's exact direct contribution to the logits,
    ``a_n LN_lin(W_out[n]) W_U`` with ``ln_final``'s scale frozen (the module docstring): their sum
    over all neurons is :func:`mlp_logit_terms`' ``"neurons"``. ``[batch, pos, n, d_vocab]``: ask
    for a few neurons at large shapes."""
    run = _last_mlp_run(model, tokens)
    ids = _neuron_ids(model, neurons)
    with torch.no_grad():
        return _per_scale(run, ids)[..., None] * (_value_logits(model, ids) @ model.W_U)


def mlp_logit_terms(model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"]) -> dict[str, Tensor]:
    """The logits split exactly at the last MLP (the module docstring), ``[batch, pos, d_vocab]``
    each: ``"before"`` (every path into the stream before it), ``"neurons"`` (the sum of every
    neuron's direct contribution), ``"b_out"`` and ``"constant"`` (``ln_final``'s ``b`` and ``b_U``;
    zeros without them). They sum to ``model(tokens)``."""
    run = _last_mlp_run(model, tokens)
    return {name: term.expand_as(run.logits) for name, term in _terms(model, run)}


def _terms(model: AttnOnlyTransformer, run: _LastMLP) -> Iterator[tuple[str, Tensor]]:
    """The four terms one at a time (each broadcasts to the logits' shape), so that a caller
    summing them holds at most two logit-sized tensors."""
    with torch.no_grad():
        ids = torch.arange(model.cfg.d_mlp, device=model.device)
        yield "before", _unembed_linear(model, run.resid_mid, run.scale)
        # summed over the neurons in d_model before the unembedding: d_mlp / d_model fewer products
        # than unembedding every neuron's value first
        yield "neurons", (_per_scale(run, ids) @ _value_logits(model, ids)) @ model.W_U
        b_out = model.blocks[-1].mlp.b_out
        zero = run.logits.new_zeros(())
        yield "b_out", zero if b_out is None else _unembed_linear(model, b_out, run.scale)
        constant = normalized(model.ln_final, torch.zeros_like(run.resid_mid[..., :1, :])) @ model.W_U
        yield "constant", constant if model.b_U is None else constant + model.b_U


def next_token_targets(tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Each position's next token as its target (``IGNORE`` at the last position)."""
    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], IGNORE)], dim=1)


def target_contributions(
    model: AttnOnlyTransformer, tokens: Int[Tensor, "batch pos"], targets: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos d_mlp"]:
    """Every last-layer neuron's exact direct contribution to the logit of each position's target
    (:func:`neuron_logit_contributions` read at the target; 0 where the target is ``IGNORE``), with
    no ``d_vocab``-long tensor per neuron."""
    return _target_contributions(model, _last_mlp_run(model, tokens), targets)


def _target_contributions(model: AttnOnlyTransformer, run: _LastMLP, targets: Tensor) -> Tensor:
    targets = targets.to(model.device)
    ids = torch.arange(model.cfg.d_mlp, device=model.device)
    with torch.no_grad():
        unembedded = model.W_U.T[targets.clamp_min(0)]  # [batch, pos, d_model]
        dots = unembedded @ _value_logits(model, ids).T  # [batch, pos, d_mlp]
        return (_per_scale(run, ids) * dots).masked_fill((targets == IGNORE)[..., None], 0.0)


def neuron_flop(cfg: Config, length: int) -> float:
    """FLOP per token of the last layer's measurement on data: the run, the target contributions
    (``d_mlp x d_model``) and the four logit terms of the check."""
    return forward_flop(cfg, length) + 2 * cfg.d_mlp * cfg.d_model * 2 + 4 * 2 * cfg.d_model * cfg.d_out


# -- the analysis: every MLP layer's top neurons ---------------------------------------------------
def _read(circuit: AttnOnlyTransformer, layer: int, ids: Tensor, effects: Tensor, k: int) -> list[Neuron]:
    """The neurons ``ids`` of ``layer`` read through the direct path, in that order."""
    keys, key_ids = neuron_keys(circuit, layer, ids, k)
    up, up_ids = neuron_values(circuit, layer, ids, k)
    down, down_ids = neuron_values(circuit, layer, ids, k, largest=False)
    gates, gate_ids = neuron_gates(circuit, layer, ids, k) if circuit.cfg.gated_mlp else (None, None)
    return [
        Neuron(
            layer=layer,
            neuron=n,
            logit_effect=float(effects[n]),
            excited_by=key_ids[i].tolist(),
            excitation=keys[i].tolist(),
            raises=up_ids[i].tolist(),
            raised=up[i].tolist(),
            lowers=down_ids[i].tolist(),
            lowered=down[i].tolist(),
            gated_by=None if gates is None else gate_ids[i].tolist(),
            gating=None if gates is None else gates[i].tolist(),
        )
        for i, n in enumerate(ids.tolist())
    ]


def _on_data(
    model: AttnOnlyTransformer, tokens: Tensor, targets: Tensor, top: int
) -> tuple[Tensor, list[NeuronOnData], float]:
    """The last layer's ``top`` neurons by mean absolute target contribution, what each did on the
    data, and the largest error of the exact split against the model's logits."""
    run = _last_mlp_run(model, tokens)
    targets = targets.to(model.device)
    has = (targets != IGNORE)[..., None]
    positions = has.sum().clamp_min(1)
    contributions = _target_contributions(model, run, targets)
    mean_abs = contributions.abs().sum((0, 1)) / positions
    ids = mean_abs.topk(min(top, len(mean_abs))).indices
    mean = contributions.sum((0, 1)) / positions
    activation = (run.post * has).sum((0, 1)) / positions
    rows = [NeuronOnData(float(activation[n]), float(mean[n]), float(mean_abs[n])) for n in ids.tolist()]
    with torch.no_grad():
        gap = run.logits.clone()
        for _, term in _terms(model, run):
            gap -= term
        error = gap.abs().max()
    return ids, rows, float(error)


def neuron_analysis(
    model: AttnOnlyTransformer,
    tokens: Int[Tensor, "batch pos"] | None = None,
    described: str | None = None,
    targets: Int[Tensor, "batch pos"] | None = None,
    k: int = TOKENS_K,
    top: int = TOP_NEURONS,
    circuit: AttnOnlyTransformer | None = None,
) -> Neurons:
    """Every MLP layer's ``top`` neurons, each read through the direct path (``k`` tokens per list;
    see the module docstring): ranked by their direct logit effect on the weights, except the last
    layer when ``tokens`` are given, ranked there by their mean absolute exact direct contribution
    to each position's target logit (``targets``, ``IGNORE`` where none; default the next token).
    ``circuit``: the model's folded form when the caller has it (else folded here)."""
    circuit, last = circuit or circuit_model(model), model.cfg.n_layers - 1
    _mlp(model, last)
    if tokens is not None:
        tokens = model.check_tokens(tokens)
        targets = next_token_targets(tokens) if targets is None else targets
    layers, error, every = [], None, neuron_logit_effects(circuit)
    for layer, effects in enumerate(every):
        if layer == last and tokens is not None:
            ids, rows, error = _on_data(model, tokens, targets, top)
            read = _read(circuit, layer, ids, effects, k)
            with_data = [replace(n, on_data=row) for n, row in zip(read, rows, strict=True)]
            layers.append(LayerNeurons(layer, DATA_RANKING, with_data))
        else:
            ids = effects.topk(min(top, len(effects))).indices
            layers.append(LayerNeurons(layer, WEIGHT_RANKING, _read(circuit, layer, ids, effects, k)))
    data = None if tokens is None else (described or "the given tokens")
    return Neurons(k, top, layers, data, error)
