"""A model whose blocks are read one at a time: :class:`LazyTransformer` holds its embedding,
positions, final norm and unembedding whole, and builds ``model.blocks[l]`` when it is asked for,
through a function of the layer, keeping the last :data:`KEEP` blocks built; the weights of the
others are not in memory. :mod:`qkov.interop.lazy` opens a model this way from its memory-mapped
safetensors.

Everything that reads a model's weights through ``model.blocks`` works on it unchanged (each
access to a block that is not kept reads it again, so an analysis that passes over every layer
several times reads every layer several times); its forward pass runs layer by layer the same way.
``model.to(device)`` (or a dtype) moves the ends at once and each block as it is built: a model
on a GPU holds its ends and the kept blocks there, and reads the rest from the mapped files.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from qkov.config import Config
from qkov.errors import QkovError
from qkov.model import ACTIVATIONS, MLP, Block, Transformer
from qkov.tall import TallMatrix

# Blocks kept built: one, so that a block's weights asked for one after another are read once. No
# analysis reads a layer twice in a row: with two kept each step read as many layers (measured),
# and at Llama-3.1-8B's shapes the second block is 256 MiB (its attention) to 960 MiB (with its MLP).
KEEP = 1
NARROW_FORWARD = (
    "this lazy model holds its embedding and unembedding narrow (their float32 copies would not fit): "
    "its weights are read by the circuits alone, not run; open it with narrow=False to run it"
)
MLP_WEIGHTS = ("W_gate", "W_in", "W_out", "b_in", "b_gate", "b_out")


class LazyMLP(MLP):
    """A block's MLP whose weights are read when one of them (or its forward) is first asked for:
    ``load()`` gives the built MLP, whose weights this one takes. Until then it holds nothing, and
    its block's ``parameters()`` list none of them: at Llama-3.1-8B's shapes the MLP is 704 of a
    layer's 872 MiB in float32, and only the neurons step and the forward pass read it. Moves of
    the block (``.to(...)``) before that are made on the weights as they are read."""

    def __init__(self, cfg: Config, load: Callable[[], MLP]) -> None:
        torch.nn.Module.__init__(self)
        self.act = ACTIVATIONS[cfg.act_fn]
        self._load: Callable[[], MLP] | None = load
        self._moves: list[Callable[[Tensor], Tensor]] = []

    def __getattr__(self, name: str):
        if name in MLP_WEIGHTS and self.__dict__.get("_load") is not None:
            self._read()
            return getattr(self, name)  # a weight, or None (an attribute then, not a Parameter)
        return super().__getattr__(name)

    def _read(self) -> None:
        mlp, self._load = self._load(), None
        for name in MLP_WEIGHTS:  # a Parameter is registered; an absent weight stays None
            setattr(self, name, getattr(mlp, name))
        for move in self._moves:
            super()._apply(move)

    def _apply(self, fn, recurse=True):
        if self._load is not None:
            self._moves.append(fn)
        return super()._apply(fn, recurse)


class LazyBlocks(Sequence[Block]):
    """``n`` blocks, each built by ``load(layer)`` when indexed; the last :data:`KEEP` kept, in
    ``kept`` when given: shared by the lazy models of one source (the model and its circuit views),
    so that :data:`KEEP` blocks are held in all, not in each."""

    def __init__(self, n: int, load: Callable[[int], Block], kept: OrderedDict | None = None) -> None:
        self.n, self.load, self.kept = n, load, OrderedDict() if kept is None else kept
        self.moves: list[Callable[[Tensor], Tensor]] = []  # ``Module._apply``'s functions, in order

    def forget(self) -> None:
        """Let go of this sequence's kept blocks (they are built again, moved, when read)."""
        for key in [key for key in self.kept if key[0] == id(self)]:
            del self.kept[key]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.n))]
        layer = index + self.n if index < 0 else index
        if not 0 <= layer < self.n:
            raise IndexError(f"layer {index} of a {self.n}-layer model")
        key = (id(self), layer)
        if key not in self.kept:
            while len(self.kept) >= KEEP:  # let go before building: never KEEP + 1 blocks at once
                self.kept.popitem(last=False)
            block = self.load(layer)
            for move in self.moves:  # the model's .to(...) calls, made on each block as it is built
                block._apply(move)
            self.kept[key] = block
        self.kept.move_to_end(key)
        return self.kept[key]

    def __iter__(self) -> Iterator[Block]:
        return (self[layer] for layer in range(self.n))


class LazyTransformer(Transformer):
    """A :class:`~qkov.model.Transformer` of ``cfg`` whose ends (the parameters outside the blocks,
    ``ends`` by their names, held as given: two lazy models may share them; zeros of ``dtype`` for
    those not given) and whose blocks are built by ``load`` when read (:class:`LazyBlocks`).
    ``circuit(ends, offsets)`` gives the lazy model the weight-based circuits read
    (:func:`qkov.interop.fold.circuit_model`) on these ends; None when this model is that already.
    ``kept``: the built blocks, shared with the other lazy models of the same source
    (:class:`LazyBlocks`).

    ``narrow``: ``W_E`` and ``W_U`` held *narrow*, as :class:`~qkov.tall.TallMatrix` read a block of
    rows at a time from their stored tensors (:func:`qkov.interop.lazy.narrow_ends`), for a model
    whose ends in the compute dtype would not fit. Its ``W_E`` and ``W_U`` parameters then hold no
    data (PyTorch's meta device): the analyses that read the ends through
    :meth:`outer_factors` alone run on it; its forward pass is refused in one line."""

    def __init__(
        self,
        cfg: Config,
        ends: dict[str, Tensor],
        load: Callable[[int], Block],
        biases: bool,
        dtype: torch.dtype,
        circuit: Callable[..., LazyTransformer] | None = None,
        kept: OrderedDict | None = None,
        narrow: dict[str, TallMatrix] | None = None,
    ) -> None:
        narrow = narrow or {}
        device = next(iter({**narrow, **ends}.values())).device
        with torch.device("meta"):
            super().__init__(cfg, biases, init=False)
        del self.blocks
        for name, param in list(self.named_parameters()):  # the ends themselves, not copies of them
            owner, _, leaf = name.rpartition(".")
            if name in narrow:
                value = torch.empty(param.shape, dtype=narrow[name].dtype, device="meta")
            else:
                value = ends[name] if name in ends else torch.zeros(param.shape, dtype=dtype, device=device)
            setattr(self.get_submodule(owner), leaf, torch.nn.Parameter(value, requires_grad=False))
        self.blocks: Sequence[Block] = LazyBlocks(cfg.n_layers, load, kept)
        self._circuit, self._circuits, self.narrow = circuit, {}, narrow

    @property
    def device(self) -> torch.device:
        return self.narrow["W_E"].device if self.narrow else super().device

    def outer_factors(self) -> tuple[Tensor | TallMatrix, Tensor | TallMatrix]:
        if self.narrow:
            return self.narrow["W_E"], self.narrow["W_U"]
        return super().outer_factors()

    def forward(self, *args, **kwargs) -> Tensor:
        if self.narrow:
            raise QkovError(NARROW_FORWARD)
        return super().forward(*args, **kwargs)

    def circuit(self, offsets: range) -> LazyTransformer:
        """The lazy circuit model for ``offsets`` (built once per range of offsets), or this one."""
        if self._circuit is None:
            return self
        key = (offsets.start, offsets.stop, offsets.step)
        if key not in self._circuits:  # on this model's ends as they are now (moved or not)
            view = self._circuit(dict(self.named_parameters()), offsets, self.narrow)
            for move in self.blocks.moves:  # a no-op on the ends moved already: the rest, the blocks
                view._apply(move)
            self._circuits[key] = view
        return self._circuits[key]

    def _apply(self, fn, recurse=True):  # what .to, .cuda, .double... call: the ends, then each block
        if self.narrow:  # a narrow end moved as each of its blocks is read; its data-less parameter kept
            self.narrow = {name: matrix.apply(fn) for name, matrix in self.narrow.items()}
            held = {name: self._parameters.pop(name) for name in self.narrow}
            super()._apply(fn, recurse)
            for name, param in held.items():
                empty = torch.empty(param.shape, dtype=self.narrow[name].dtype, device="meta")
                self._parameters[name] = torch.nn.Parameter(empty, requires_grad=False)
        else:
            super()._apply(fn, recurse)
        self.blocks.moves.append(fn)
        self.blocks.forget()
        self._circuits = {}  # views share the ends: made again from the moved ones when asked for
        return self
