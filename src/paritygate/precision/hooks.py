"""Torch plumbing for the precision pass: layer selection, in-place casts, tensor trees, hooks.

Casting swaps the storage of parameters and floating buffers (``p.data``) and
returns a function that puts the original fp32 tensors back, so a model is
never copied: during a low-precision pass the process holds the fp32 weights
plus one low-precision copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from paritygate.precision.config import PrecisionSpec

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

T = TypeVar("T")


@dataclass(frozen=True)
class LayerInfo:
    """A measured module: its qualified name, class, and whether it has children."""

    name: str
    type: str
    kind: str  # "leaf" | "block"
    has_params: bool


def select_layers(model: nn.Module, spec: PrecisionSpec) -> dict[nn.Module, LayerInfo]:
    """Modules to measure (the root excluded), filtered by ``spec.layers``/include/exclude."""
    selected: dict[nn.Module, LayerInfo] = {}
    for name, module in model.named_modules():
        if not name or module in selected:
            continue
        kind = "block" if any(True for _ in module.children()) else "leaf"
        if spec.layers != "all" and {"leaves": "leaf", "blocks": "block"}[spec.layers] != kind:
            continue
        if spec.include and not any(fnmatchcase(name, p) for p in spec.include):
            continue
        if any(fnmatchcase(name, p) for p in spec.exclude):
            continue
        has_params = any(True for _ in module.parameters(recurse=False))
        selected[module] = LayerInfo(name, type(module).__name__, kind, has_params)
    return selected


def parameterised_leaves(model: nn.Module) -> set[nn.Module]:
    """Leaf modules with their own parameters (D of the output budget counts their calls)."""
    return {
        m
        for m in model.modules()
        if not any(True for _ in m.children()) and any(True for _ in m.parameters(recurse=False))
    }


class ParamSource:
    """Where streamed parameters' values are read from (:mod:`~.streaming`), in any dtype."""

    def streams(self, p: nn.Parameter) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def read(self, p: nn.Parameter, dtype: torch.dtype) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


SOURCE_ATTR = "_paritygate_param_source"


def read_from(source: ParamSource, modules: Iterable[nn.Module]) -> None:
    """Mark ``modules``' streamed parameters as read from ``source``: a cast of a loaded one
    frees it and reads the cast dtype from the source, and the undo reads the original dtype
    again, so a module rerun in low precision never holds its weights twice. The mark sits on
    the modules: a parameter moved between the meta device and memory is swapped in place
    (:func:`assign`), which a weak reference to it would forbid."""
    for m in modules:
        object.__setattr__(m, SOURCE_ATTR, source)


def _source(mod: nn.Module, p: nn.Parameter) -> ParamSource | None:
    source = getattr(mod, SOURCE_ATTR, None)
    return source if source is not None and source.streams(p) else None


def cast_params(
    module: nn.Module,
    dtype: torch.dtype,
    keep: Iterable[nn.Module] = (),
    cache: dict[int, torch.Tensor] | None = None,
) -> Callable[[], None]:
    """Cast floating parameters and buffers of ``module`` in place; returns the undo function.

    Modules in ``keep`` (and everything below them) stay as they are. With a
    ``cache`` (tensor id -> its cast copy, filled on first use), each tensor is
    cast once and later calls only swap the copies in. A loaded parameter of a
    module marked by :func:`read_from` is freed and read in ``dtype`` from its
    source instead, and read back in its own dtype on undo.
    """

    def cast(t: torch.Tensor) -> torch.Tensor:
        if cache is None:
            return t.detach().to(dtype)
        low = cache.get(id(t))
        if low is None:
            low = cache[id(t)] = t.detach().to(dtype)
        return low

    skip: set[int] = set()
    for kept in keep:
        skip.update(id(m) for m in kept.modules())
    params: list[tuple[nn.Parameter, torch.Tensor]] = []
    reread: list[tuple[nn.Parameter, ParamSource, torch.dtype]] = []
    buffers: list[tuple[nn.Module, str, torch.Tensor]] = []
    seen: set[int] = set()
    for mod in module.modules():
        if id(mod) in skip:
            continue
        for p in mod._parameters.values():
            if p is None or id(p) in seen or not p.is_floating_point() or p.dtype == dtype:
                continue
            seen.add(id(p))
            source = _source(mod, p)
            if source is not None and not p.is_meta and cache is None:
                reread.append((p, source, p.dtype))  # freed now, read again on undo
                release(p)
                assign(p, source.read(p, dtype))
                continue
            params.append((p, p.data))
            p.data = cast(p)
        for name, b in mod._buffers.items():
            if b is None or not b.is_floating_point() or b.dtype == dtype:
                continue
            buffers.append((mod, name, b))
            mod._buffers[name] = cast(b)

    def restore() -> None:
        for p, original in params:
            assign(p, original)
        for p, source, was in reread:  # the low-precision copy freed before the read
            release(p)
            assign(p, source.read(p, was))
        for mod, name, original in buffers:
            mod._buffers[name] = original

    return restore


def map_tree(obj: T, fn: Callable[[object], object]) -> T:
    """Apply ``fn`` to every leaf (anything but a tuple, list or dict) of a nested structure;
    the structure keeps its shape (its leaves are ``fn``'s, whatever their type)."""
    return _map_tree(obj, fn)  # type: ignore[return-value]  # same shape, mapped leaves


def _map_tree(obj: object, fn: Callable[[object], object]) -> object:
    if isinstance(obj, dict):
        mapped = {k: _map_tree(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(**mapped) if type(obj) is not dict else mapped
        except TypeError:
            return mapped
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        named: Callable[..., object] = type(obj)
        return named(*(_map_tree(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tree(v, fn) for v in obj)
    return fn(obj)


def map_tensors(
    obj: T, fn: Callable[[torch.Tensor], object], every: bool = False
) -> T:
    """Apply ``fn`` to every floating tensor of a nested tuple, list or dict (``every``: to
    every tensor, integer ones too)."""

    def leaf(x: object) -> object:
        if isinstance(x, torch.Tensor) and (every or x.is_floating_point()):
            return fn(x)
        return x

    return map_tree(obj, leaf)


def floating_tensors(obj: object) -> list[torch.Tensor]:
    """Floating tensors of a nested output, in a deterministic order."""
    found: list[torch.Tensor] = []
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            found.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            found.extend(floating_tensors(value))
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            found.extend(floating_tensors(value))
    return found


def first_floating(args: tuple[object, ...], kwargs: Mapping[str, object]
                   ) -> torch.Tensor | None:
    """The module's main input: the first floating tensor among args, else among kwargs."""
    for source in (args, kwargs):
        tensors = floating_tensors(source)
        if tensors:
            return tensors[0]
    return None


def saturating_cast(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """Cast to ``dtype`` clamping to its finite range.

    Used for a layer's inputs in the local run (an input the format cannot hold
    is the previous layer's overflow, which that layer's own row reports), and
    for additive masks built with float32's lowest value.
    """
    if dtype == torch.float32:
        return lambda t: t.to(torch.float32)
    limit = torch.finfo(dtype).max

    def cast(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == dtype:
            return t
        # cast, then clamp the copy in place: the same values as clamping first (a value
        # past the largest finite one rounds to it or to Inf), without a full-size temporary
        return t.to(dtype).clamp_(-limit, limit)

    return cast


class CallCounter:
    """Names repeated calls of one module within a forward: ``act``, ``act#1``, ..."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def key(self, module: nn.Module, name: str) -> tuple[str, int]:
        index = self.counts.get(id(module), 0)
        self.counts[id(module)] = index + 1
        return (f"{name}#{index}" if index else name), index


class Hooks:
    """Hooks on the selected modules: ``on_enter(key, info, module, args, kwargs)`` when a call
    starts (optional: before the module can change its inputs in place) and
    ``on_call(key, info, module, args, kwargs, output)`` when it returns.

    Calls are named when they start (:class:`CallCounter`). ``paused`` silences both while
    the measurement itself runs a module again.
    """

    def __init__(
        self,
        layers: dict[nn.Module, LayerInfo],
        on_call: Callable[..., None],
        on_enter: Callable[..., None] | None = None,
    ) -> None:
        self.layers = layers
        self.on_call = on_call
        self.on_enter = on_enter
        self.paused = False
        self.counter = CallCounter()
        self._open: dict[int, list[str]] = {}
        """module -> keys of its calls started and not yet returned (a stack: recursion)."""
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> Hooks:
        for module, info in self.layers.items():
            self._handles.append(
                module.register_forward_pre_hook(self._pre_hook(info), with_kwargs=True)
            )
            self._handles.append(module.register_forward_hook(self._hook(info), with_kwargs=True))
        return self

    def _pre_hook(self, info: LayerInfo) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
                     ) -> None:
            if self.paused:
                return
            key, _ = self.counter.key(module, info.name)
            self._open.setdefault(id(module), []).append(key)
            if self.on_enter is not None:
                self.on_enter(key, info, module, args, kwargs)

        return pre_hook

    def _hook(self, info: LayerInfo) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object],
                 output: object) -> None:
            if self.paused:
                return
            key = self._open[id(module)].pop()
            self.on_call(key, info, module, args, kwargs, output)

        return hook

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._open.clear()


def _input_caster(dtype: torch.dtype) -> Callable[
        [nn.Module, tuple[object, ...], dict[str, object]],
        tuple[tuple[object, ...], dict[str, object]]]:
    """Forward pre-hook casting a module's floating inputs to ``dtype`` (integers untouched).

    A plain cast, as a graph converted to ``dtype`` computes: a value an fp32
    forward produced out of the format's range overflows here as it would there.
    """

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == dtype else t.to(dtype)

    def pre_hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
                 ) -> tuple[tuple[object, ...], dict[str, object]]:
        return map_tensors(args, cast), map_tensors(kwargs, cast)

    return pre_hook


def _output_caster(dtype: torch.dtype) -> Callable[[nn.Module, tuple[object, ...], object],
                                                   object]:
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == dtype else t.to(dtype)

    def hook(module: nn.Module, args: tuple[object, ...], output: object) -> object:
        return map_tensors(output, cast)

    return hook


def lookups(module: nn.Module) -> list[nn.Module]:
    """Embedding tables below ``module`` whose lookup is a plain gather (no ``max_norm``
    renormalisation), so casting the gathered rows equals gathering cast rows."""
    return [m for m in module.modules() if type(m) is nn.Embedding and m.max_norm is None]


class LowPrecision:
    """Run ``module`` as a graph converted to ``dtype`` would run, restoring it on exit.

    Parameters and floating buffers are cast in place (:func:`cast_params`), and
    every module gets a forward pre-hook casting its floating inputs to its own
    dtype, so a forward that upcasts (``obs.float()``, an fp32 mask) still feeds
    each low-precision module its dtype; integer inputs (token ids, discrete
    observations) are never cast. Modules in ``keep`` (and below) compute in
    fp32 on fp32 copies of their inputs and hand their floating outputs on in
    ``dtype``, as a runtime that pins a node in fp32 casts around it. Embedding
    lookups are kept that way too: rows cast after the gather equal rows
    gathered from a cast table, and the table (often the largest tensor) gets
    no low-precision copy.
    """

    def __init__(
        self,
        module: nn.Module,
        dtype: torch.dtype,
        keep: Iterable[nn.Module] = (),
        cache: dict[int, torch.Tensor] | None = None,
    ) -> None:
        self.module = module
        self.dtype = dtype
        self.keep = list(keep)
        self.keep += [m for m in lookups(module) if m not in self.keep]
        self.cache = cache
        self._restore: Callable[[], None] | None = None
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> LowPrecision:
        kept = {id(m) for k in self.keep for m in k.modules()}
        self._restore = cast_params(self.module, self.dtype, keep=self.keep, cache=self.cache)
        for mod in self.module.modules():
            target = torch.float32 if id(mod) in kept else self.dtype
            self._handles.append(
                mod.register_forward_pre_hook(_input_caster(target), with_kwargs=True)
            )
        for mod in self.keep:
            self._handles.append(mod.register_forward_hook(_output_caster(self.dtype)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._restore is not None:
            self._restore()
            self._restore = None


def assign(p: nn.Parameter, value: torch.Tensor) -> None:
    """``p.data = value``, also across devices: a streamed layer's parameters move between the
    meta device and memory (:mod:`paritygate.precision.streaming`), and ``p`` stays the same
    object, so tied aliases and pending restores still refer to it."""
    if p.device == value.device:
        p.data = value
    else:
        torch.utils.swap_tensors(p, nn.Parameter(value, requires_grad=p.requires_grad))


def release(p: nn.Parameter) -> None:
    """Free ``p``'s memory: it becomes a meta placeholder of its shape and dtype, the same
    object, until :func:`assign` gives it values again."""
    assign(p, torch.empty(p.shape, dtype=p.dtype, device="meta"))
