"""Models in and out of qkov: Hugging Face GPT-2 (:mod:`qkov.interop.hf`), TransformerLens
(:mod:`qkov.interop.transformer_lens`) and LayerNorm folding (:mod:`qkov.interop.fold`).

An imported model is an ordinary qkov model (:class:`qkov.Transformer`); ``cfg.source`` says where
it came from. :func:`import_checkpoint` is ``qkov import``: it tells the two kinds of folder apart by
their ``config.json`` and writes a qkov checkpoint folder.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from qkov.checkpoint import save
from qkov.errors import QkovError
from qkov.interop.fold import Folded, FoldNote, fold
from qkov.interop.hf import from_hf
from qkov.interop.source import read_config_json, weights_file
from qkov.interop.transformer_lens import (
    from_transformer_lens,
    save_transformer_lens,
    to_hooked_transformer,
    to_transformer_lens,
)
from qkov.model import Transformer

__all__ = [
    "FoldNote",
    "Folded",
    "fold",
    "folder_kind",
    "from_hf",
    "from_transformer_lens",
    "import_checkpoint",
    "save_transformer_lens",
    "to_hooked_transformer",
    "to_transformer_lens",
]


def folder_kind(folder: Path) -> str:
    """``"huggingface"`` (its config.json has ``model_type``) or ``"transformer_lens"`` (it has
    ``normalization_type`` or ``positional_embedding_type``)."""
    data = read_config_json(folder)
    if "model_type" in data:
        return "huggingface"
    if "normalization_type" in data or "positional_embedding_type" in data:
        return "transformer_lens"
    if "positional_embedding" in data:
        raise QkovError(f"{folder}: already a qkov checkpoint (nothing to import)")
    raise QkovError(
        f"{folder / 'config.json'}: neither a Hugging Face config (model_type) nor a TransformerLens "
        "config (normalization_type)"
    )


def import_checkpoint(
    src: str | os.PathLike, out: str | os.PathLike, fold: bool = True
) -> tuple[Transformer, list[str]]:
    """``qkov import``: read the folder ``src`` (Hugging Face or TransformerLens), fold it unless
    ``fold`` is false, and save a qkov checkpoint folder at ``out``. Returns the model and the notes
    (one line each) about folding that could not be done exactly."""
    src, out = Path(src), Path(out)
    weights_file(src)
    if out.resolve() == src.resolve():
        raise QkovError(f"{out}: the output folder must differ from the source folder")
    kind = folder_kind(src)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FoldNote)
        model = from_hf(src, fold) if kind == "huggingface" else from_transformer_lens(src, fold)
    save(model, out)
    return model, [str(w.message) for w in caught if issubclass(w.category, FoldNote)]
