"""Weights in any layout, by a mapping from their keys to qkov's: a small JSON file (no Python)
that ``qkov import WEIGHTS --mapping map.json`` and :func:`from_weights` read.

A mapping is a JSON object with

- ``"config"``: the qkov :class:`~qkov.config.Config` fields of the model (``n_layers``,
  ``n_heads``, ``d_model``, ``d_head``, ``d_vocab``, ``n_ctx``, ``positional_embedding`` ...);
- ``"tensors"``: for each qkov tensor (TransformerLens' names: ``W_E``, ``W_pos``,
  ``blocks.{layer}.attn.W_Q`` ..., ``W_U``; ``{layer}`` stands for every layer) the source tensor it
  is, either its name or ``{"from": NAME, "rearrange": PATTERN, "sizes": {AXIS: N}, "index": I}``:
  the einops ``rearrange`` pattern may use the config's axis names (``n_heads``, ``d_head``,
  ``d_model``, ``d_vocab``, ``n_ctx``, ``d_mlp``, bound to their sizes) and others sized by
  ``sizes``; ``index`` then takes entry ``I`` of the result's first axis (a fused ``W_qkv``);
- ``"ignore"`` (optional): source tensors that are not weights (glob patterns, e.g. ``"*.mask"``).

Every source tensor must be mapped or ignored, so a forgotten one is an error, not a silent
omission. An ``nn.Linear(d_in, d_out)`` stores ``[d_out, d_in]`` and computes ``x @ weight.T``:
qkov's row-vector weights are its transpose (``"d_vocab d_model -> d_model d_vocab"`` for an
unembedding); a fused ``nn.Linear(d_model, 3 * d_model)`` whose output is ``q, k, v``, each
head-major, gives ``W_Q`` by ``"(qkv n_heads d_head) d_model -> qkv n_heads d_model d_head"`` with
``sizes {"qkv": 3}`` and ``index 0``. A fixed position buffer (sinusoids) is ``W_pos`` like any
learned one.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import einops
from torch import Tensor

from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop.agreement import checked_agreement, forward_reference
from qkov.interop.source import check_finite, model_from_source, read_weights, weights_file
from qkov.io import read_json
from qkov.model import Transformer

_KEYS = {"config", "tensors", "ignore"}
_SPEC_KEYS = {"from", "rearrange", "sizes", "index"}
LAYER = "{layer}"


@dataclass(frozen=True)
class TensorSpec:
    """How one qkov tensor is read from the source's (see the module docstring)."""

    source: str
    pattern: str | None = None
    sizes: tuple[tuple[str, int], ...] = ()
    index: int | None = None


@dataclass(frozen=True)
class Mapping:
    """A parsed mapping: the model's config, each qkov tensor's spec (layers expanded), and the
    glob patterns of source tensors to ignore. ``where`` names it in errors."""

    config: Config
    tensors: dict[str, TensorSpec]
    ignore: tuple[str, ...]
    where: str


def tensor_spec(value: Any, name: str, where: str) -> TensorSpec:
    """One tensor's spec, with one line for what is malformed."""
    if isinstance(value, str):
        return TensorSpec(value)
    if not isinstance(value, dict):
        raise QkovError(f"{where}: tensors.{name} must be a tensor name or an object with 'from'")
    unknown = sorted(set(value) - _SPEC_KEYS)
    if unknown:
        raise QkovError(f"{where}: tensors.{name}: unknown key(s) {', '.join(unknown)}")
    sizes, index = value.get("sizes", {}), value.get("index")
    if not isinstance(value.get("from"), str) or not isinstance(value.get("rearrange", ""), str):
        raise QkovError(f"{where}: tensors.{name}: 'from' (and 'rearrange') must be strings")
    if not isinstance(sizes, dict) or not all(type(n) is int and n > 0 for n in sizes.values()):
        raise QkovError(f"{where}: tensors.{name}: 'sizes' must map axis names to positive integers")
    if index is not None and type(index) is not int:
        raise QkovError(f"{where}: tensors.{name}: 'index' must be an integer")
    return TensorSpec(value["from"], value.get("rearrange"), tuple(sorted(sizes.items())), index)


def expanded(specs: dict[str, TensorSpec], n_layers: int, where: str) -> dict[str, TensorSpec]:
    """``{layer}`` replaced by each layer, in the qkov name and the source name alike."""
    out = {}
    for name, spec in specs.items():
        if LAYER not in name:
            if LAYER in spec.source:
                raise QkovError(f"{where}: tensors.{name} reads {spec.source}, but {name} has no {LAYER}")
            out[name] = spec
            continue
        for layer in range(n_layers):
            source = spec.source.replace(LAYER, str(layer))
            out[name.replace(LAYER, str(layer))] = TensorSpec(source, spec.pattern, spec.sizes, spec.index)
    return out


def parse_mapping(data: Any, where: str) -> Mapping:
    """A mapping from its parsed JSON, with one line for an unknown key or a malformed entry."""
    if not isinstance(data, dict):
        raise QkovError(f"{where}: expected a JSON object")
    unknown = sorted(set(data) - _KEYS)
    missing = sorted({"config", "tensors"} - set(data))
    if unknown or missing:
        problem = f"unknown key(s) {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise QkovError(f"{where}: {problem} (a mapping has config, tensors and optional ignore)")
    try:
        config = Config.from_dict(data["config"])
    except QkovError as err:
        raise QkovError(f"{where}: config: {str(err).removeprefix('config.json: ')}") from None
    if not isinstance(data["tensors"], dict):
        raise QkovError(f"{where}: tensors must be an object (qkov name: source tensor)")
    ignore = data.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise QkovError(f"{where}: ignore must be a list of tensor names or glob patterns")
    specs = {name: tensor_spec(value, name, where) for name, value in data["tensors"].items()}
    return Mapping(config, expanded(specs, config.n_layers, where), tuple(ignore), where)


def read_mapping(mapping: Mapping | dict | str | os.PathLike) -> Mapping:
    """A mapping given as parsed JSON, a file, or already parsed."""
    if isinstance(mapping, Mapping):
        return mapping
    if isinstance(mapping, dict):
        return parse_mapping(mapping, "mapping")
    file = Path(mapping)
    if not file.is_file():
        raise QkovError(f"{file}: no such mapping file")
    return parse_mapping(read_json(file), str(file))


def axis_sizes(cfg: Config, spec: TensorSpec) -> dict[str, int]:
    """The sizes of the axes ``spec``'s pattern names: the config's, then the spec's own."""
    known = {"n_heads": cfg.n_heads, "d_head": cfg.d_head, "d_model": cfg.d_model}
    known |= {"d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_out, "n_ctx": cfg.n_ctx}
    known |= {"d_mlp": cfg.d_mlp} if cfg.has_mlp else {}
    known |= dict(spec.sizes)
    named = set(re.findall(r"[A-Za-z_]\w*", spec.pattern or ""))
    return {axis: size for axis, size in known.items() if axis in named}


def mapped_tensor(tensor: Tensor, name: str, spec: TensorSpec, cfg: Config, where: str) -> Tensor:
    """The qkov tensor ``name`` read from the source tensor by ``spec``."""
    sizes = axis_sizes(cfg, spec)
    if spec.pattern:
        try:
            tensor = einops.rearrange(tensor, spec.pattern, **sizes)
        except einops.EinopsError:
            raise QkovError(
                f"{where}: tensor {spec.source} has shape {tuple(tensor.shape)}, which does not fit "
                f"{spec.pattern!r} ({', '.join(f'{a}={n}' for a, n in sizes.items())}) for {name}"
            ) from None
    if spec.index is not None:
        if tensor.ndim == 0 or not -tensor.shape[0] <= spec.index < tensor.shape[0]:
            shape = tuple(tensor.shape)
            raise QkovError(f"{where}: index {spec.index} is out of range for {name} (shape {shape})")
        tensor = tensor[spec.index]
    return tensor.contiguous()


def mapped_tensors(tensors: dict[str, Tensor], mapping: Mapping, where: str) -> dict[str, Tensor]:
    """The source's tensors in qkov's names, by ``mapping``; one line for a source tensor that
    is missing, or neither mapped nor ignored."""
    for name, spec in mapping.tensors.items():
        if spec.source not in tensors:
            raise QkovError(f"{where}: missing tensor {spec.source} (the mapping reads it for {name})")
    used = {spec.source for spec in mapping.tensors.values()}
    for source in tensors:
        if source not in used and not any(fnmatch.fnmatchcase(source, p) for p in mapping.ignore):
            raise QkovError(f"{where}: tensor {source} is not mapped (map it, or list it under ignore)")
    return {
        name: mapped_tensor(tensors[spec.source], name, spec, mapping.config, where)
        for name, spec in mapping.tensors.items()
    }


def from_weights(
    weights: dict[str, Tensor] | str | os.PathLike,
    mapping: Mapping | dict | str | os.PathLike,
    fold: bool = True,
    forward: Callable[[Tensor], Tensor] | None = None,
    tokens: Tensor | None = None,
    tolerance: float | None = None,
) -> Transformer:
    """A qkov model from weights in any layout: a state dict, or a file (``.safetensors``, or a
    pickled ``.pt``/``.pth``/``.bin`` read by :mod:`qkov.pickles`) or a folder holding one,
    read through ``mapping`` (a file, or its parsed JSON; see the module docstring), folded by
    default (:func:`qkov.interop.fold.fold`).

    With ``forward`` (the source model's own forward: token ids ``[batch, pos]`` to logits
    ``[batch, pos, d_vocab]``), prints the largest log-probability difference between the two on
    ``tokens`` (default: 4 random sequences of ``n_ctx`` tokens) and raises :class:`QkovError`
    when it exceeds ``tolerance``: the mapping is checked, not trusted."""
    mapping = read_mapping(mapping)
    if isinstance(weights, dict):
        tensors, where = dict(weights), "state dict"
    else:
        file = weights_file(Path(weights))
        tensors, where = read_weights(file), str(file)
    check_finite(tensors, where)
    qkov_tensors = mapped_tensors(tensors, mapping, where)
    model = model_from_source(mapping.config, qkov_tensors, f"{where} by {mapping.where}", None, fold)
    if forward is not None:
        tokens, reference = forward_reference(model, forward, tokens)
        print(checked_agreement(model, tokens, reference, "the given forward", tolerance))
    return model
