"""Checkpoint folders: ``config.json``, ``model.safetensors`` and, when there is one,
``tokenizer.json``. Never pickle: loading reads tensors and JSON, and executes nothing.

Loading validates everything and raises :class:`QkovError` with one line that names the problem
and the tensor: missing or unexpected tensors, shapes that do not fit the config, non-finite values,
a truncated or corrupt file, a tokenizer whose vocabulary does not fit ``d_vocab``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Tokenizer
from torch import nn

from qkov.config import Config
from qkov.errors import QkovError
from qkov.io import atomic_write_text, checkpoint_folder, read_json
from qkov.model import MLP, Block, Transformer
from qkov.sizes import check_model_size
from qkov.tensorfile import read_tensor_file, write_tensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
M = TypeVar("M", bound=nn.Module)


def expected_shapes(cfg: Config) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The tensors a checkpoint of ``cfg`` must hold, and the optional biases (absent = zero): the
    parameters of the model ``cfg`` describes, built without memory (on PyTorch's meta device).
    A norm's ``w`` and ``b`` are required (they are the norm)."""
    with torch.device("meta"):
        model = Transformer(cfg, biases=True, init=False)
    required: dict[str, tuple[int, ...]] = {}
    optional: dict[str, tuple[int, ...]] = {}
    for name, param in model.named_parameters():
        (optional if is_bias(name) else required)[name] = tuple(param.shape)
    return required, optional


def save(model: Transformer, path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> Path:
    """Write ``model`` (and ``tokenizer``, else ``model.tokenizer`` if set) as a checkpoint folder.

    Each file is written atomically. Returns the folder.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise QkovError(f"{folder}: exists and is not a folder")
    if not isinstance(model.blocks, torch.nn.ModuleList):
        raise QkovError(
            f"{folder}: a lazy model holds only its embeddings in memory and cannot be saved; import "
            "the source instead (qkov import, or qkov.open_model without lazy, then save)"
        )
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    tensors = {name: p.detach().contiguous().cpu() for name, p in model.named_parameters()}
    write_tensors(folder / WEIGHTS_FILE, tensors)  # with a checksum of the tensors, checked on load
    if tokenizer is not None:
        atomic_write_text(folder / TOKENIZER_FILE, tokenizer.to_str())
    atomic_write_text(folder / CONFIG_FILE, model.cfg.to_json())
    return folder


def load_config(path: str | os.PathLike) -> Config:
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise QkovError(f"{path}: not a checkpoint folder (no {CONFIG_FILE})")
    return Config.from_dict(read_json(file))


def read_tensors(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a safetensors file and its metadata, with one clear error if the file is
    missing, truncated or corrupt, or its tensors do not match the checksum qkov wrote beside them
    (:mod:`qkov.tensorfile`; a file without one is read as it is)."""
    return read_tensor_file(file)


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity: one pass (NaN propagates through min and max), several times faster than
    ``isfinite(tensor).all()`` on the CPU at GPT-2 size."""
    if tensor.dtype.itemsize < 2:  # float8 has no min/max kernels: widen it (it is a quarter the size)
        tensor = tensor.float()
    return tensor.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(tensor))).all())


def check_weights(cfg: Config, tensors: dict[str, torch.Tensor], source: str) -> bool:
    """Validate tensor names, shapes, dtypes and values against ``cfg``; return whether biases
    are present."""
    return check_tensors(*expected_shapes(cfg), tensors, source, f"a {cfg.n_layers}-layer model")


def check_tensors(
    required: dict[str, tuple[int, ...]],
    optional: dict[str, tuple[int, ...]],
    tensors: dict[str, torch.Tensor],
    source: str,
    what: str,
    values: bool = True,
) -> bool:
    """:func:`check_weights` against the ``required`` and ``optional`` names and shapes of ``what``
    (a model, or one block of a lazy model); ``values``: also dtypes and finiteness (not for
    tensors without data, on PyTorch's meta device). Returns whether biases are present."""
    missing = [name for name in required if name not in tensors]
    if missing:
        raise QkovError(f"{source}: missing tensor {missing[0]} (config expects {len(required)} tensors)")
    unexpected = [name for name in tensors if name not in required and name not in optional]
    if unexpected:
        raise QkovError(f"{source}: unexpected tensor {unexpected[0]} (not part of {what})")
    for name, tensor in tensors.items():
        shape = required.get(name) or optional[name]
        if tuple(tensor.shape) != shape:
            raise QkovError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, config expects {shape}"
            )
        if not tensor.dtype.is_floating_point:
            raise QkovError(f"{source}: tensor {name} has dtype {tensor.dtype}, expected floating point")
        if values and not all_finite(tensor):
            raise QkovError(f"{source}: tensor {name} has non-finite values (NaN or inf)")
    return any(name in optional for name in tensors)


def block_shapes(cfg: Config, layer: int, biases: bool = True) -> dict[str, tuple[int, ...]]:
    """The names (``blocks.{layer}.…``) and shapes of one block's parameters, built without memory."""
    with torch.device("meta"):
        block = Block(cfg, biases, layer)
    return {f"blocks.{layer}.{name}": tuple(p.shape) for name, p in block.named_parameters()}


def block_from_tensors(
    cfg: Config,
    layer: int,
    tensors: dict[str, torch.Tensor],
    biases: bool,
    dtype: torch.dtype,
    source: str,
    mlp: MLP | None = None,
    values: bool = True,
) -> Block:
    """Block ``layer`` of a model of ``cfg`` holding exactly ``tensors`` (by their names in the
    model, validated as :func:`model_from_tensors` validates a model's) in ``dtype``; an absent
    bias is zero. What a lazy model (:mod:`qkov.interop.lazy`) builds as it reads a layer. ``mlp``:
    the block's MLP, built apart (a lazy model's, read when first used); ``tensors`` then hold
    none of it. ``values``: check the values too (:func:`check_tensors`)."""
    block = Block(cfg, biases, layer)
    if mlp is not None:
        block.mlp = mlp
    return filled(block, f"blocks.{layer}.", tensors, dtype, source, f"layer {layer}", values)


def mlp_from_tensors(
    cfg: Config,
    layer: int,
    tensors: dict[str, torch.Tensor],
    biases: bool,
    dtype: torch.dtype,
    source: str,
    values: bool = True,
) -> MLP:
    """Block ``layer``'s MLP holding exactly ``tensors`` (``blocks.{layer}.mlp.…``), as
    :func:`block_from_tensors` builds a block."""
    mlp = MLP(cfg, biases)
    return filled(mlp, f"blocks.{layer}.mlp.", tensors, dtype, source, f"layer {layer}'s MLP", values)


def filled(
    module: M,
    prefix: str,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype,
    source: str,
    what: str,
    values: bool = True,
) -> M:
    """``module`` holding ``tensors`` (its parameters' names after ``prefix``), checked (their
    values too with ``values``)."""
    every = {prefix + name: tuple(p.shape) for name, p in module.named_parameters()}
    required = {name: shape for name, shape in every.items() if not is_bias(name)}
    optional = {name: shape for name, shape in every.items() if is_bias(name)}
    check_tensors(required, optional, tensors, source, what, values)
    # The module's own parameters are allocated but never written (so never resident): each is
    # replaced by its tensor, converted only when its dtype differs, so that building a block from
    # a layer read in the compute dtype copies nothing.
    for name, param in list(module.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        tensor = tensors.get(prefix + name)
        tensor = torch.zeros(param.shape, dtype=dtype) if tensor is None else tensor.detach().to(dtype)
        setattr(module.get_submodule(owner), leaf, nn.Parameter(tensor, requires_grad=False))
    return module.to(dtype)  # the buffers (rotary frequencies)


def is_bias(name: str) -> bool:
    """Whether a parameter's name is a bias's (``b_Q``, ``_b_K``, ``b_U``, ...; not a norm's ``b``)."""
    return name.rsplit(".", 1)[-1].lstrip("_").startswith("b_")


def load_tokenizer(path: str | os.PathLike, d_vocab: int | None = None) -> Tokenizer | None:
    """The checkpoint's tokenizer, or None when it has none; checked against ``d_vocab``."""
    file = Path(path) / TOKENIZER_FILE
    if not file.exists():
        if file.is_symlink():
            raise QkovError(f"{file}: a link that leads to no file (a loop, or its target is missing)")
        return None
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception for bad JSON
        raise QkovError(f"{file}: not a valid tokenizer ({str(err).splitlines()[0]})") from None
    size = tokenizer.get_vocab_size()
    if d_vocab is not None and size > d_vocab:
        raise QkovError(f"{file}: tokenizer has {size} tokens, more than the model's d_vocab={d_vocab}")
    return tokenizer


COMPUTE_DTYPES = (torch.float32, torch.float64)


def model_from_tensors(cfg: Config, tensors: dict[str, torch.Tensor], source: str) -> Transformer:
    """A model holding exactly ``tensors`` (validated) on their device, in ``W_E``'s dtype when it is
    float32 or float64, else in float32: half-precision and float8 weights (bfloat16 checkpoints,
    the usual way models are shared now) are read exactly and computed in float32, since several
    analyses (QR, eigenvalues) have no half-precision kernels and would lose digits in them."""
    check_model_size(cfg, source)
    biases = check_weights(cfg, tensors, source)
    dtype = tensors["W_E"].dtype if tensors["W_E"].dtype in COMPUTE_DTYPES else torch.float32
    with torch.device(tensors["W_E"].device):
        model = Transformer(cfg, biases=biases, init=False).to(dtype)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if name in tensors:
                param.copy_(tensors[name])
            else:  # an absent bias is zero
                param.zero_()
    return model


def load(path: str | os.PathLike) -> Transformer:
    """Load a checkpoint folder written by :func:`save` (or by hand with numpy and safetensors).

    The tokenizer, when the folder has one, is ``model.tokenizer``. A path to a file in the folder
    (its ``model.safetensors``, ``config.json``) means the folder.
    """
    folder = checkpoint_folder(path)
    cfg = load_config(folder)
    tensors, _ = read_tensors(folder / WEIGHTS_FILE)
    model = model_from_tensors(cfg, tensors, str(folder / WEIGHTS_FILE))
    model.tokenizer = load_tokenizer(folder, cfg.d_vocab)
    return model
