"""Reading a model written by another library (Hugging Face, TransformerLens, a researcher's own
code): its JSON config and its weights, with one clear line for everything that can be wrong.

Weights are a ``model.safetensors`` file or a pickled state dict (``.pt``, ``.pth``, ``.bin``), read
only through ``torch.load(weights_only=True)`` (:mod:`qkov.pickles`): tensors and plain
containers, never code. A source is a folder (its ``model.safetensors``, else its one pickle) or a
weights file; its config is the ``config.json`` beside the weights unless another is given.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkov.checkpoint import all_finite, load_tokenizer, model_from_tensors, read_tensors
from qkov.config import Config
from qkov.errors import QkovError
from qkov.io import read_json
from qkov.model import Transformer
from qkov.pickles import PICKLE_SUFFIXES, read_pickled_tensors
from qkov.tensorfile import MappedTensor, map_tensor_file

WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
SHARD_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class SourceFolder:
    """A source's parsed config, its tensors, the folder when it has a tokenizer.json, and the
    weights' and config's files (to name them in errors)."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer_folder: Path | None
    weights: Path
    config_file: Path


def read_config_file(file: Path) -> dict[str, Any]:
    if not file.is_file():
        if file.name == "config.json":
            raise QkovError(f"{file.parent}: no config.json (give one with --config)")
        raise QkovError(f"{file}: missing")
    data = read_json(file)
    if not isinstance(data, dict):
        raise QkovError(f"{file}: expected a JSON object")
    return data


def weights_file(src: Path) -> Path:
    """The weights of ``src``: the file itself, or a folder's ``model.safetensors``, else its one
    pickled state dict; one line when there is none, or several to choose from."""
    if src.is_file():
        if src.suffix not in WEIGHT_SUFFIXES and src.name != SHARD_INDEX:
            raise QkovError(f"{src}: not a weights file (expected {', '.join(WEIGHT_SUFFIXES)})")
        return src
    if not src.is_dir():
        raise QkovError(f"{src}: no such file or folder")
    if (src / "model.safetensors").exists():
        return src / "model.safetensors"
    if (src / SHARD_INDEX).exists():
        return src / SHARD_INDEX
    pickles = sorted(f.name for f in src.iterdir() if f.suffix in PICKLE_SUFFIXES and f.is_file())
    if len(pickles) > 1:
        raise QkovError(f"{src}: several weights files ({', '.join(pickles)}): give the one to import")
    if not pickles:
        raise QkovError(f"{src}: no model.safetensors and no .pt, .pth or .bin state dict")
    return src / pickles[0]


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, of the shards a ``model.safetensors.index.json`` lists,
    or of a pickled state dict (see the module docstring)."""
    if file.name == SHARD_INDEX:
        return read_shards(file)
    if file.suffix == ".safetensors":
        return read_tensors(file)[0]
    return read_pickled_tensors(file)


def read_shards(index: Path, read: Callable[[Path], dict] = lambda f: read_tensors(f)[0]) -> dict:
    """The tensors of sharded safetensors, as Hugging Face writes them: the index's ``weight_map``
    names each tensor's shard, a file in the same folder; every shard's tensors must be the index's.
    ``read`` reads one shard (:func:`map_weights` maps them instead)."""
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise QkovError(f"{index}: expected a weight_map of tensor names to shard files")
    tensors: dict = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise QkovError(f"{index}: shard {shard!r} is not a .safetensors file beside the index")
        tensors |= read(index.parent / shard)
    if set(tensors) != set(weight_map):
        missing = sorted(set(weight_map) - set(tensors)) or sorted(set(tensors) - set(weight_map))
        raise QkovError(f"{index}: the shards and the index disagree on tensor {missing[0]}")
    return tensors


def map_weights(file: Path) -> dict[str, MappedTensor]:
    """Every tensor of a safetensors file or of the shards an index lists, mapped, not read
    (:func:`qkov.tensorfile.map_tensor_file`); one line for a pickled state dict, which cannot be."""
    if file.name == SHARD_INDEX:
        return read_shards(file, lambda shard: map_tensor_file(shard)[0])
    if file.suffix != ".safetensors":
        raise QkovError(f"{file}: lazy reading needs safetensors weights (one file or shards), not a pickle")
    return map_tensor_file(file)[0]


def config_file(weights: Path, config: str | os.PathLike | None) -> Path:
    """``config``, else the ``config.json`` beside the weights."""
    return Path(config) if config is not None else weights.parent / "config.json"


def read_source(src: str | os.PathLike, config: str | os.PathLike | None = None) -> SourceFolder:
    """Config, tensors and tokenizer folder of a source (see the module docstring); ``config``
    replaces the ``config.json`` beside the weights."""
    weights = weights_file(Path(src))
    file = config_file(weights, config)
    data = read_config_file(file)
    tensors = read_weights(weights)
    tokenizer_folder = weights.parent if (weights.parent / "tokenizer.json").is_file() else None
    return SourceFolder(data, tensors, tokenizer_folder, weights, file)


def check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """One line naming the first tensor (in the source's own names) with NaN or infinite values."""
    for name, tensor in tensors.items():
        if tensor.dtype.is_floating_point and not all_finite(tensor):
            raise QkovError(f"{where}: tensor {name} has non-finite values (NaN or inf)")


def model_from_source(
    cfg: Config, tensors: dict[str, torch.Tensor], where: str, tokenizer_folder: Path | None, fold: bool
) -> Transformer:
    """The qkov model of tensors already in qkov's names (validated against ``cfg``), with the
    source's tokenizer, folded when ``fold`` (a fold that cannot be exact says so as a warning)."""
    from qkov.interop.fold import FoldNote
    from qkov.interop.fold import fold as fold_model

    model = model_from_tensors(cfg, tensors, where)
    model.tokenizer = load_tokenizer(tokenizer_folder, cfg.d_vocab) if tokenizer_folder else None
    if not fold:
        return model
    folded = fold_model(model)
    if folded.note:
        warnings.warn(folded.note, FoldNote, stacklevel=3)
    return folded.model
