"""Reading a model folder written by another library (Hugging Face, TransformerLens): its JSON
config and its safetensors weights, with one clear line for everything that can be wrong. Never
unpickle: a folder with only ``pytorch_model.bin`` is refused with instructions to convert it."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkov.checkpoint import all_finite, load_tokenizer, model_from_tensors, read_tensors
from qkov.config import Config
from qkov.errors import QkovError
from qkov.io import read_json
from qkov.model import Transformer

CONVERT_HINT = (
    'qkov never unpickles weights; convert it to safetensors first, e.g. python -c "from transformers '
    "import AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}', "
    'safe_serialization=True)" (this unpickles: run it only on files you trust)'
)


@dataclass(frozen=True)
class SourceFolder:
    """A folder's parsed ``config.json``, its tensors, and the folder when it has a tokenizer.json."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer_folder: Path | None


def read_config_json(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        raise QkovError(f"{folder}: no config.json")
    data = read_json(file)
    if not isinstance(data, dict):
        raise QkovError(f"{file}: expected a JSON object")
    return data


def weights_file(folder: Path) -> Path:
    """The folder's ``model.safetensors``, with one line when the folder or the file is missing
    (and how to convert a pickled ``pytorch_model.bin``)."""
    if not folder.is_dir():
        raise QkovError(f"{folder}: no such folder")
    weights = folder / "model.safetensors"
    if not weights.exists():
        if (folder / "pytorch_model.bin").exists():
            raise QkovError(
                f"{folder}: only pytorch_model.bin (a pickle); " + CONVERT_HINT.format(folder=folder)
            )
        if (folder / "model.safetensors.index.json").exists():
            raise QkovError(f"{folder}: sharded safetensors are not supported (model.safetensors.index.json)")
        raise QkovError(f"{folder}: no model.safetensors")
    return weights


def read_source_folder(folder: Path) -> SourceFolder:
    """Config, tensors and tokenizer folder of a model folder (see the module docstring)."""
    weights = weights_file(folder)
    config = read_config_json(folder)
    tensors, _ = read_tensors(weights)
    tokenizer_folder = folder if (folder / "tokenizer.json").is_file() else None
    return SourceFolder(config, tensors, tokenizer_folder)


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
