"""Models in and out of qkov: Hugging Face GPT-2 (:mod:`qkov.interop.hf`), TransformerLens
(:mod:`qkov.interop.transformer_lens`: 3.x's ``HookedTransformer``, 4.x's ``TransformerBridge`` in
:mod:`qkov.interop.transformer_bridge`, legacy configs in :mod:`qkov.interop.tl_legacy`), weights in
any other layout by a key mapping (:mod:`qkov.interop.mapping`), pickled state dicts read safely
(:mod:`qkov.pickles`) and LayerNorm folding (:mod:`qkov.interop.fold`).

An imported model is an ordinary qkov model (:class:`qkov.Transformer`); ``cfg.source`` says where
it came from. :func:`import_checkpoint` is ``qkov import``: it tells the kinds of source apart by
their ``config.json`` (or reads a mapping) and writes a qkov checkpoint folder.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

from qkov.checkpoint import load, save
from qkov.errors import QkovError
from qkov.hub_cache import resolve_source
from qkov.interop.agreement import checked_agreement, log_prob_difference, reference_file
from qkov.interop.fold import Folded, FoldNote, fold
from qkov.interop.hf import from_hf
from qkov.interop.lazy import open_lazy
from qkov.interop.mapping import from_weights
from qkov.interop.source import config_file, read_config_file, weights_file
from qkov.interop.tl_legacy import is_legacy
from qkov.interop.transformer_lens import (
    from_transformer_lens,
    save_transformer_lens,
    to_hooked_transformer,
    to_transformer_bridge,
    to_transformer_lens,
)
from qkov.io import checkpoint_folder
from qkov.model import Transformer

__all__ = [
    "FoldNote",
    "Folded",
    "fold",
    "folder_kind",
    "from_hf",
    "from_transformer_lens",
    "from_weights",
    "import_checkpoint",
    "open_model",
    "log_prob_difference",
    "resolve_source",
    "save_transformer_lens",
    "to_hooked_transformer",
    "to_transformer_bridge",
    "to_transformer_lens",
]


def folder_kind(src: Path, config: str | os.PathLike | None = None) -> str:
    """``"huggingface"`` (the config has ``model_type``) or ``"transformer_lens"`` (it has
    ``normalization_type`` or ``positional_embedding_type``, or is a legacy config); the config is
    ``config``, else the ``config.json`` beside ``src``'s weights."""
    file = config_file(weights_file(Path(src)), config)
    data = read_config_file(file)
    if "model_type" in data:
        return "huggingface"
    if _is_transformer_lens(data):
        return "transformer_lens"
    if "positional_embedding" in data:
        raise QkovError(f"{file.parent}: already a qkov checkpoint (nothing to import)")
    raise QkovError(
        f"{file}: neither a Hugging Face config (model_type) nor a TransformerLens config "
        "(normalization_type, or the legacy normalization); weights in another layout need --mapping"
    )


def open_model(path: str | os.PathLike, lazy: bool = False, narrow: bool | None = None) -> Transformer:
    """Any model folder, as ``qkov analyze``, ``info`` and ``serve`` take it: a qkov checkpoint is
    loaded (:func:`qkov.load`); a Hugging Face folder (any family of :mod:`qkov.interop.adapters`,
    one ``model.safetensors`` or shards with ``model.safetensors.index.json``) or a TransformerLens
    one is imported in memory and folded, as ``qkov import`` would write it. A path to a file in the
    folder means the folder. A Hugging Face name, ``org/name`` or ``org/name@revision``, that is no
    existing path is read from the local Hugging Face cache, never downloaded
    (:mod:`qkov.hub_cache`).

    With ``lazy`` (Hugging Face and qkov safetensors folders), nothing but the embeddings, the final
    norm and the unembedding is read at open: each layer is read from the memory-mapped weights when
    it is used, and the weight-based analyses read the model folded layer by layer, in memory that
    does not grow with the depth (:mod:`qkov.interop.lazy`). ``narrow`` (with ``lazy``): whether
    the embedding and unembedding are held narrow, read a block of tokens at a time by the circuits
    alone (:func:`qkov.interop.lazy.narrow_ends`); by default when in float32 they would take more
    than :data:`qkov.interop.lazy.WHOLE_ENDS_BYTES`."""
    folder = checkpoint_folder(resolve_source(path))
    if narrow is not None and not lazy:
        raise QkovError("narrow= holds a lazy model's embeddings narrow: give lazy=True with it")
    if lazy:
        return open_lazy(folder, narrow=narrow)
    data = read_config_file(folder / "config.json")
    if "positional_embedding" in data or "model_type" not in data and not _is_transformer_lens(data):
        return load(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoldNote)  # the model says what stays unfolded (cfg.normalization)
        return from_hf(folder) if "model_type" in data else from_transformer_lens(folder)


def _is_transformer_lens(data: dict) -> bool:
    return "normalization_type" in data or "positional_embedding_type" in data or is_legacy(data)


def import_checkpoint(
    src: str | os.PathLike,
    out: str | os.PathLike,
    fold: bool = True,
    config: str | os.PathLike | None = None,
    mapping: str | os.PathLike | None = None,
    reference: str | os.PathLike | None = None,
    bos_token_id: int | None = None,
) -> tuple[Transformer, list[str]]:
    """``qkov import``: read ``src`` (a folder, a weights file: safetensors or a pickled state dict, or a
    model's name in the local Hugging Face cache: :func:`open_model`) as Hugging Face or TransformerLens
    weights with ``config`` (default: the ``config.json`` beside them), or through ``mapping``
    (:mod:`qkov.interop.mapping`); fold it unless ``fold`` is false; with ``reference`` (a safetensors file of
    ``tokens`` and the source's ``logits``), check the log-probabilities agree; with ``bos_token_id``, record
    the start token the model's sequences begin with (replacing the source's); and save a qkov checkpoint
    folder at ``out``, only once all that succeeded. Returns the model and the lines to show: ``note: ...``
    for each folding step that could not be done exactly, and the agreement with the reference."""
    src, out = resolve_source(src), Path(out)
    weights = weights_file(src)
    if out.resolve() == weights.parent.resolve():
        raise QkovError(f"{out}: the output folder must differ from the source folder")
    if mapping is not None and config is not None:
        raise QkovError("give a config or a mapping, not both (a mapping holds the model's config)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FoldNote)
        if mapping is not None:
            model = from_weights(weights, mapping, fold)
        elif folder_kind(src, config) == "huggingface":
            model = from_hf(src, fold, config)
        else:
            model = from_transformer_lens(src, fold, config)
    lines = [f"note: {w.message}" for w in caught if issubclass(w.category, FoldNote)]
    if bos_token_id is not None:
        model.cfg = dataclasses.replace(model.cfg, bos_token_id=bos_token_id)
    if reference is not None:
        tokens, logits = reference_file(reference)
        lines.append(checked_agreement(model, tokens, logits, str(reference)))
    save(model, out)
    return model, lines
