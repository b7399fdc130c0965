"""Hooks on a run, as TransformerLens has them: ``fn(activation, hook)`` is called at a named point of
the forward (``hook.name`` is the point's TransformerLens hook name) and returns the activation to
use from there on, or None to keep it (edited in place or not). Activation patching replaces
``blocks.{l}.hook_resid_pre`` at a position, or a head's slice of ``blocks.{l}.attn.hook_z`` or
``hook_result``, with the same activation from another run (section "Residual Stream": every later
reader sees the patched stream).

:class:`Recorder` is where a run of :meth:`qkov.model.Transformer.run_with_cache` puts each activation:
through the hooks first, then into the cache under its hook name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import Tensor

from qkov.errors import QkovError

_LAYER = re.compile(r"blocks\.(\d+)\.")


@dataclass(frozen=True)
class HookPoint:
    """The point a hook function is called at: ``name`` is its TransformerLens hook name."""

    name: str

    def layer(self) -> int:
        """The block the point belongs to (TransformerLens' ``hook.layer()``)."""
        match = _LAYER.match(self.name)
        if match is None:
            raise QkovError(f"hook point {self.name} belongs to no block")
        return int(match[1])


HookFn = Callable[..., Tensor | None]


def _matching(name_or_filter: object, fn: object, points: Sequence[str]) -> list[str]:
    """The points one ``(name_or_filter, fn)`` pair of ``fwd_hooks`` hooks, checked."""
    if not callable(fn):
        raise QkovError(f"a hook must be a function fn(activation, hook), got {type(fn).__name__}")
    if isinstance(name_or_filter, str):
        if name_or_filter not in points:
            raise QkovError(
                f"no hook point {name_or_filter!r} in this model (qkov.names.hook_points(model.cfg) "
                f"lists its {len(points)}: {', '.join(points[:4])}, ...)"
            )
        return [name_or_filter]
    if callable(name_or_filter):
        return [name for name in points if name_or_filter(name)]
    raise QkovError(
        f"a hook is (name, fn) or (filter, fn) with filter(name) -> bool, got {type(name_or_filter).__name__}"
    )


class Hooks:
    """``fwd_hooks`` (pairs ``(name or filter(name) -> bool, fn)``, TransformerLens' form) resolved
    against a model's hook points once; several hooks on one point run in the order given."""

    def __init__(self, fwd_hooks: Iterable[tuple[object, HookFn]], points: Sequence[str]) -> None:
        self.by_point: dict[str, list[HookFn]] = {}
        for pair in fwd_hooks:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise QkovError(f"fwd_hooks holds (name, fn) pairs, got {pair!r}")
            for name in _matching(pair[0], pair[1], points):
                self.by_point.setdefault(name, []).append(pair[1])

    def __call__(self, name: str, activation: Tensor) -> Tensor:
        for fn in self.by_point.get(name, ()):
            out = fn(activation, hook=HookPoint(name))
            if out is None:
                continue
            if not isinstance(out, Tensor) or out.shape != activation.shape:
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise QkovError(
                    f"the hook on {name} returned {got}: expected a tensor of shape "
                    f"{tuple(activation.shape)} or None"
                )
            activation = out
        return activation


def names_kept(names_filter: object, points: Sequence[str]) -> Callable[[str], bool]:
    """TransformerLens' ``names_filter`` of ``run_with_cache`` as a test of a hook name: None keeps
    every activation, a name (one of ``points``) that one, a list of names those, a function
    ``filter(name) -> bool`` those it accepts."""
    if names_filter is None:
        return lambda name: True
    if callable(names_filter):
        return names_filter
    names = [names_filter] if isinstance(names_filter, str) else names_filter
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise QkovError(
            "names_filter is a hook name, a list of them or a function of one, got "
            f"{type(names_filter).__name__}"
        )
    unknown = [name for name in names if name not in points]
    if unknown:
        raise QkovError(
            f"no hook point {unknown[0]!r} in this model (qkov.names.hook_points(model.cfg) lists them)"
        )
    kept = set(names)
    return kept.__contains__


def patterns_only(name: str) -> bool:
    """The ``names_filter`` of a run whose cache keeps every attention pattern and nothing else."""
    return name.endswith("hook_pattern")


class Recorder:
    """Each activation of a run: through the hooks (when any), then into ``cache`` by its name when
    ``keep(name)`` (:func:`names_kept`)."""

    def __init__(self, hooks: Hooks | None, keep: Callable[[str], bool]) -> None:
        self.hooks, self.keep = hooks, keep
        self.cache: dict[str, Tensor] = {}

    def hooked(self, name: str) -> bool:
        return self.hooks is not None and name in self.hooks.by_point

    def wants(self, name: str) -> bool:
        """Whether the activation ``name`` is hooked or kept: one that nothing reads need not be
        formed."""
        return self.keep(name) or self.hooked(name)

    def __call__(self, name: str, activation: Tensor) -> Tensor:
        if self.hooks is not None:
            activation = self.hooks(name, activation)
        if self.keep(name):
            self.cache[name] = activation
        return activation
