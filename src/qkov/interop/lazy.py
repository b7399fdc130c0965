"""Lazy, streamed weights: ``qkov.open_model(path, lazy=True)``.

A Hugging Face folder (any family of :mod:`qkov.interop.adapters`, one ``model.safetensors`` or
shards with ``model.safetensors.index.json``) or a qkov checkpoint is opened without reading its
weights: every tensor is memory-mapped (:func:`qkov.tensorfile.map_tensor_file`, the header
checked), and the family's adapter runs once on tensors without data (PyTorch's meta device), so
that a missing, unexpected or misshapen tensor is one line at open, as it is for a model read whole.
Then the embedding, positions, final norm and unembedding are read, converted to the compute dtype
(that of a model read whole: float32, or float64 when the renamed embedding is) and held; each block
is read when ``model.blocks[l]`` is asked for, renamed by the same adapter code, converted, checked
(shapes, non-finite values) and built, and only the last one built is kept
(:class:`~qkov.interop.lazy_model.LazyTransformer`).

Each block is folded as it is read (:func:`~qkov.interop.fold.fold_tensors`, the code
:func:`~qkov.interop.fold.fold` runs on a whole model), so that the lazy model is the folded model
:func:`qkov.open_model` gives without ``lazy``. A block's MLP is read, folded and checked apart,
when it is first used (:class:`~qkov.interop.lazy_model.LazyMLP`): the attention steps never read
it. ``circuit_model`` of it
(:func:`qkov.interop.fold.circuit_model`) is the model itself, or, for a model with rotary
positions, grouped-query attention, query/key norms or norms after each sublayer, another lazy
model over the same mapped tensors whose blocks are turned into the circuit view
(:func:`~qkov.interop.fold.view_layer`) as they are read. The weight-based analyses read it
unchanged, in memory that grows with the width and the vocabulary, not with the depth: they pass
over the layers one at a time, and composition keeps only its writers' factors, within a budget.
The forward pass of a lazy model runs layer by layer, reading each layer again on every pass:
correct, and slow for anything but a few batches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Tokenizer
from torch import Tensor

from qkov.checkpoint import (
    COMPUTE_DTYPES,
    block_from_tensors,
    block_shapes,
    check_tensors,
    expected_shapes,
    is_bias,
    load_tokenizer,
    mlp_from_tensors,
)
from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop.fold import (
    VIEW_FEATURES,
    centres_unembed,
    fold_tensors,
    gained,
    view_config,
    view_layer,
)
from qkov.interop.hf import Renaming, renaming
from qkov.interop.lazy_model import MLP_WEIGHTS, LazyMLP, LazyTransformer
from qkov.interop.source import map_weights, read_config_file, weights_file
from qkov.model import MLP, Block
from qkov.sizes import check_weight_magnitudes
from qkov.tall import TallMatrix
from qkov.tensorfile import MappedTensor, map_tensor_file, page_out

# Above this many bytes of embedding and unembedding in the compute dtype, a lazy model holds them
# narrow (narrow_ends): Llama-3.1-8B's are 3.9 GiB in float32 and stay whole, as before;
# Llama-3.1-70B's are 7.8 GiB, more than the 8 GB its one-layer analysis is to fit in.
WHOLE_ENDS_BYTES = 4 * 2**30
M = TypeVar("M", Block, MLP)


class MappedState(Mapping[str, Tensor]):
    """Mapped tensors by name, each read (a zero-copy view of its bytes) when asked for."""

    def __init__(self, mapped: dict[str, MappedTensor]) -> None:
        self.mapped = mapped

    def __getitem__(self, name: str) -> Tensor:
        return self.mapped[name].read()

    def __iter__(self) -> Iterator[str]:
        return iter(self.mapped)

    def __len__(self) -> int:
        return len(self.mapped)


@dataclass(frozen=True)
class LazySource:
    """A model's mapped tensors in qkov's names (``names``), the compute dtype, whether it has
    biases, its weights' file (to name in errors) and its tokenizer; ``checked``: the parts
    (:meth:`built`) whose values were checked when first built."""

    names: Renaming
    dtype: torch.dtype
    biases: bool
    where: str
    tokenizer: Tokenizer | None
    checked: set[tuple[str, int]] = field(default_factory=set, compare=False)

    @property
    def cfg(self) -> Config:
        return self.names.cfg

    def ends(self) -> dict[str, Tensor]:
        return owned(self.names.ends(), self.dtype)

    def layer(self, layer: int, mlp: bool) -> dict[str, Tensor]:
        """Layer ``layer``'s MLP (and the norm before it), or everything else of it."""
        tensors = self.names.layer(layer)
        tensors = {name: tensors[name] for name in tensors if is_mlp(name, layer) == mlp}  # the rest let go
        return owned(tensors, self.dtype, stored_order=True)

    def built(self, kind: str, make: Callable[..., M], cfg: Config, layer: int, state: dict, **more) -> M:
        """``make`` (:func:`~qkov.checkpoint.block_from_tensors` or ``mlp_from_tensors``) of layer
        ``layer``'s ``state``: a ``kind`` of part (``"block"``, ``"mlp"``, or the circuit view's),
        its values checked for NaN and infinity the first time it is built only. The same mapped
        bytes give the same values at every later read, and checking them again took 0.16 s of the
        0.26 s in which a Llama-3.2-1B layer's MLP is read, hundreds of times in a full analyze."""
        values = (kind, layer) not in self.checked
        module = make(cfg, layer, state, layer_biases(self), self.dtype, self.where, values=values, **more)
        self.checked.add((kind, layer))  # once built: a read interrupted before its check checks again
        return module


def is_mlp(name: str, layer: int) -> bool:
    """Whether a layer's tensor is its MLP's or the norm's before it (read when the MLP is)."""
    return name.startswith((f"blocks.{layer}.mlp.", f"blocks.{layer}.ln2."))


def owned(tensors: dict[str, Tensor], dtype: torch.dtype, stored_order: bool = False) -> dict[str, Tensor]:
    """``tensors`` in ``dtype``, each a copy of its own (folding overwrites them: a tensor already in
    ``dtype`` would otherwise be a view of the mapped file, or of another tensor, as a tied
    unembedding is of the embedding), contiguous (an adapter may give a transposed view), or with
    ``stored_order`` in the order of the stored bytes (a transposed view stays one). Each mapped
    tensor is let go as soon as it is converted, so that its pages of the file stop counting."""
    copy = stored_order_copy if stored_order else contiguous_copy
    return {name: copy(tensors.pop(name), dtype) for name in list(tensors)}


def contiguous_copy(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty(tensor.shape, dtype=dtype).copy_(tensor)


def stored_order_copy(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor`` in ``dtype``, its elements in the order of its stored bytes (``torch.empty_like``
    keeps the strides of a dense tensor). A layer's weights are read so: Hugging Face stores each
    matrix as ``[out, in]``, which qkov reads transposed, and converting a bfloat16 ``[8192, 2048]``
    matrix into the transposed order took 0.075 s against 0.029 s in its own (a Llama-3.2-1B MLP's
    three, at each read of a layer); matrix products read either order at the same rate."""
    return torch.empty_like(tensor, dtype=dtype, device="cpu").copy_(tensor)


def qkov_names(cfg: Config, state: Mapping[str, Tensor]) -> Renaming:
    """A qkov checkpoint's tensors, already in qkov's names: the ends, and ``blocks.{l}.…``."""

    def ends() -> dict[str, Tensor]:
        return {name: state[name] for name in state if not name.startswith("blocks.")}

    def layer(layer: int) -> dict[str, Tensor]:
        return {name: state[name] for name in state if name.startswith(f"blocks.{layer}.")}

    return Renaming(cfg, ends, layer, lambda: None)


def reads_lazily(folder: Path) -> bool:
    """Whether :func:`open_lazy` reads ``folder``: a qkov checkpoint, or a Hugging Face folder whose
    weights are safetensors (one file or shards), not a pickle or a TransformerLens folder."""
    data = read_config_file(folder / "config.json")
    if "positional_embedding" in data:
        return True
    return "model_type" in data and weights_file(folder).suffix in (".safetensors", ".json")


def lazy_source(folder: Path, dtype: torch.dtype | None = None) -> LazySource:
    """A folder's tensors mapped and checked by running its adapter on tensors without data."""
    data = read_config_file(folder / "config.json")
    if "positional_embedding" in data:  # a qkov checkpoint
        cfg, weights = Config.from_dict(data), folder / "model.safetensors"
        mapped = map_tensor_file(weights)[0]
        names = qkov_names(cfg, MappedState(mapped))
        meta = qkov_names(cfg, {name: m.meta() for name, m in mapped.items()})
    elif "model_type" in data:
        weights, where = weights_file(folder), str(folder / "config.json")
        mapped = map_weights(weights)
        names = renaming(data, MappedState(mapped), str(weights), where)
        meta = renaming(data, {name: m.meta() for name, m in mapped.items()}, str(weights), where)
    else:
        raise QkovError(
            f"{folder}: lazy=True reads Hugging Face and qkov safetensors folders; read this one whole "
            "(lazy=False)"
        )
    tensors = meta.tensors()  # every source tensor read once, by the adapter's own code
    cfg = names.cfg
    biases = check_tensors(*expected_shapes(cfg), tensors, str(weights), "this model", values=False)
    if dtype is None:
        dtype = tensors["W_E"].dtype if tensors["W_E"].dtype in COMPUTE_DTYPES else torch.float32
    tokenizer = load_tokenizer(folder, cfg.d_vocab) if (folder / "tokenizer.json").exists() else None
    return LazySource(names, dtype, biases, str(weights), tokenizer)


def open_lazy(folder: Path, dtype: torch.dtype | None = None, narrow: bool | None = None) -> LazyTransformer:
    """The lazy model of a Hugging Face or qkov folder (see the module docstring), folded as
    :func:`qkov.open_model` folds a model it reads whole; ``dtype``: the compute dtype, by default
    a model read whole's; ``narrow``: whether its embedding and unembedding are held narrow
    (:func:`narrow_ends`), by default when they would take more than :data:`WHOLE_ENDS_BYTES`."""
    source = lazy_source(folder, dtype)
    cfg = source.cfg
    if narrow is None:
        narrow = (cfg.d_vocab + cfg.d_out) * cfg.d_model * source.dtype.itemsize > WHOLE_ENDS_BYTES
    cfg, ends, tall = narrow_ends(source) if narrow else (*folded_ends(source), None)
    viewed, kept = any(f in VIEW_FEATURES for f in cfg.features), OrderedDict()  # blocks held, in all
    circuit = partial(circuit_lazy, source, cfg, kept) if viewed else None
    load = partial(model_block, source)
    model = LazyTransformer(cfg, ends, load, layer_biases(source), source.dtype, circuit, kept, tall)
    model.tokenizer = source.tokenizer
    return model


def folded_ends(source: LazySource) -> tuple[Config, dict[str, Tensor]]:
    """The model's config and ends, folded when its norms have weights (:func:`fold_tensors`)."""
    cfg, ends = source.cfg, source.ends()
    if not cfg.affine_norms:
        return cfg, ends
    ends.setdefault("b_U", torch.zeros(cfg.d_out, dtype=source.dtype))
    return fold_tensors(ends, cfg, [], ends=True)[0], ends


def narrow_ends(source: LazySource) -> tuple[Config, dict[str, Tensor], dict[str, TallMatrix]]:
    """The model's config, its ends but the embedding and unembedding (converted and folded as
    :func:`folded_ends` folds them), and those two held narrow: :class:`~qkov.tall.TallMatrix`
    over the stored tensors, each block of rows converted and folded when it is read, by the same
    code (:func:`folded_block`). Folding is block by block but for what spans the vocabulary, done
    here in one pass over the unembedding: ``b_U`` (``ln_final``'s bias through ``W_U``) and step
    3's mean over ``d_vocab`` (taken in float64). The results equal the whole model's to float
    rounding. The stored tensors' magnitudes are checked here."""
    cfg, stored = source.cfg, source.names.ends()
    tall = {name: stored.pop(name) for name in ("W_E", "W_U")}  # the mapped bytes, never copied whole
    check_weight_magnitudes(tall, source.where)
    raw, mean = owned(stored, source.dtype), torch.zeros(cfg.d_model, 1, dtype=source.dtype)
    if cfg.affine_norms:
        raw.setdefault("b_U", torch.zeros(cfg.d_out, dtype=source.dtype))
    fold = partial(folded_block, source, raw, tall)  # every block folded from the stored ends
    ends = raw
    if cfg.affine_norms:
        biases, total = [], torch.zeros(cfg.d_model, dtype=torch.float64)
        for start in range(0, cfg.d_out, UNEMBED_ROWS):
            block = fold("W_U", start, min(start + UNEMBED_ROWS, cfg.d_out))[1]
            biases.append(block["b_U"])
            total += block["W_U"].sum(1, dtype=torch.float64)
        cfg, ends = fold("W_E", 0, 0)  # the folded config and ends, no token of W_E or W_U
        ends["b_U"] = torch.cat(biases)
        if centres_unembed(cfg):  # step 3 over the whole vocabulary, as fold_tensors does it
            mean = (total / cfg.d_out).to(source.dtype)[:, None]
            ends["b_U"] -= ends["b_U"].mean()
    ends = {name: value for name, value in ends.items() if name not in tall}

    def embedding(start: int, stop: int) -> Tensor:
        return fold("W_E", start, stop)[1]["W_E"]

    def unembedding(start: int, stop: int) -> Tensor:  # rows of W_U^T: the tokens' unembeddings
        return (fold("W_U", start, stop)[1]["W_U"] - mean).mT

    E = TallMatrix(embedding, (cfg.d_vocab, cfg.d_model), source.dtype, "cpu")
    U = TallMatrix(unembedding, (cfg.d_out, cfg.d_model), source.dtype, "cpu")
    return cfg, ends, {"W_E": E, "W_U": U.mT}


UNEMBED_ROWS = 4096  # tokens of the unembedding folded at once for its mean: 128 MiB at width 8192


def folded_block(
    source: LazySource, small: dict[str, Tensor], stored: dict[str, Tensor], name: str, start: int, stop: int
) -> tuple[Config, dict[str, Tensor]]:
    """Tokens ``start:stop`` of the stored ``name`` (``W_E``'s rows or ``W_U``'s columns), converted
    and, with the model's norms' weights, folded with the other ends (``small``, converted, not
    folded; with the unembedding its block of ``b_U``) by :func:`fold_tensors`, step 3 left out:
    the folded config, and the ends so folded, the other of ``W_E`` and ``W_U`` empty."""
    cfg, dtype = source.cfg, source.dtype
    state = {key: value.clone() for key, value in small.items() if key != "b_U"}
    rows = slice(start, stop) if name == "W_U" else slice(0, 0)
    block = stored["W_E"][start:stop] if name == "W_E" else stored["W_U"][:, rows]
    state["W_E"] = contiguous_copy(block if name == "W_E" else stored["W_E"][:0], dtype)
    state["W_U"] = contiguous_copy(stored["W_U"][:, rows], dtype)
    page_out(block)  # its pages of the mapped file read: let go, so that a pass holds a block of them
    if "b_U" in small:
        state["b_U"] = small["b_U"][rows].clone()
    if not cfg.affine_norms:
        return cfg, state
    return fold_tensors(state, cfg, [], ends=True, centre_unembed=False)[0], state


def model_block(source: LazySource, layer: int) -> Block:
    """Block ``layer`` renamed, converted, checked and folded as a model read whole is; its MLP
    (a :class:`~qkov.interop.lazy_model.LazyMLP`) read the same way when first used."""
    cfg, state = folded_layer(source, layer, mlp=False)
    mlp = LazyMLP(cfg, partial(model_mlp, source, layer)) if cfg.has_mlp else None
    return source.built("block", block_from_tensors, cfg, layer, state, mlp=mlp)


def model_mlp(source: LazySource, layer: int) -> MLP:
    """Block ``layer``'s MLP, read as :func:`model_block` reads the rest."""
    cfg, state = folded_layer(source, layer, mlp=True)
    return source.built("mlp", mlp_from_tensors, cfg, layer, state)


def folded_layer(source: LazySource, layer: int, mlp: bool) -> tuple[Config, dict[str, Tensor]]:
    """Layer ``layer``'s MLP or the rest of it (:meth:`LazySource.layer`), converted and folded,
    and the folded config (:func:`fold_tensors`, run on a model read whole by :func:`fold`)."""
    cfg, state = source.cfg, source.layer(layer, mlp)
    if not cfg.affine_norms:
        return cfg, state
    shapes = block_shapes(cfg, layer).items()
    zeros = {
        name: torch.zeros(shape, dtype=source.dtype)
        for name, shape in shapes
        if is_bias(name) and is_mlp(name, layer) == mlp
    }
    state = zeros | state  # every bias, zeros where the model has none (as fold's)
    return fold_tensors(state, cfg, [layer], ends=False)[0], state


def layer_biases(source: LazySource) -> bool:
    """Whether a block has biases: always once folded (zeros where the model has none)."""
    return source.cfg.affine_norms or source.biases


def circuit_lazy(
    source: LazySource,
    cfg: Config,
    kept: OrderedDict,
    ends: dict[str, Tensor],
    offsets: range,
    narrow: dict[str, TallMatrix] | None = None,
) -> LazyTransformer:
    """The lazy model :func:`qkov.interop.fold.circuit_model` gives for ``offsets``: the circuit
    view (:func:`~qkov.interop.fold.circuit_view`) of the folded model (of config ``cfg``), one layer
    at a time, sharing the folded model's ``ends`` (the view changes no end: at Llama 3's vocabulary
    a copy of the embedding and unembedding is 2 GiB), its ``narrow`` ends if it holds them so,
    and its ``kept`` blocks."""
    load = partial(view_block, source, cfg, offsets)
    model = LazyTransformer(
        view_config(cfg), ends, load, layer_biases(source), source.dtype, kept=kept, narrow=narrow
    )
    model.tokenizer = source.tokenizer
    return model


def view_block(source: LazySource, cfg: Config, offsets: range, layer: int) -> Block:
    """Block ``layer`` of the circuit view of the folded model (of config ``cfg``); its MLP read
    when first used, from the folded block's, through the norm after it (:func:`gained`)."""
    block = model_block(source, layer)
    state = view_layer(cfg, layer, block, offsets)
    mlp = None
    if block.mlp is not None:  # holds the folded block's MLP, not read yet, and not the rest of it
        mlp = LazyMLP(cfg, partial(view_mlp, source, layer, block.mlp, block.ln2_post))
    return source.built("view block", block_from_tensors, view_config(cfg), layer, state, mlp=mlp)


def view_mlp(source: LazySource, layer: int, mlp: MLP, post: torch.nn.Module | None) -> MLP:
    """The circuit view's MLP of block ``layer``, from the folded block's ``mlp`` and the norm
    after it (``post``, or None)."""
    m = f"blocks.{layer}.mlp."
    state = {m + name: getattr(mlp, name).detach() for name in MLP_WEIGHTS if getattr(mlp, name) is not None}
    gained(state, post, [m + "W_out", m + "b_out"])
    return source.built("view mlp", mlp_from_tensors, source.cfg, layer, state)
