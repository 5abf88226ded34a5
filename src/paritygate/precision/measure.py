"""The precision pass: per batch, one low-precision forward per dtype, then one fp32 forward.

For each probe batch:

1. For each dtype, the model's parameters are cast in place, every module's
   floating inputs are cast to its dtype (integer inputs never are), and the
   batch runs once with hooks that keep every measured layer's output (and main input) in
   that dtype: the *cumulative* run (every layer inherits the error of the
   layers before it). Only this batch's tensors are kept, in low precision.
2. The model runs once in fp32. Each layer's hook folds, into streamed
   accumulators: its fp32 activation range; its cumulative error (stored
   low-precision output vs fp32 output, and the same for its input, which gives
   the amplification); its *local* error (the layer alone, cast to the dtype,
   rerun on its own fp32 inputs, so inherited error is excluded); and, when an
   ONNX artifact is compared, the artifact's tensor mapped to that layer.

The batch's stored tensors are then dropped; nothing but accumulators survives
a batch. The model exists once in fp32, plus one low-precision copy of its
weights during step 1 (or of one layer's weights during a local run).
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paritygate.precision.config import PrecisionSpec
from paritygate.precision.hooks import (
    Hooks,
    LayerInfo,
    LowPrecision,
    first_floating,
    floating_tensors,
    map_tensors,
    parameterised_leaves,
    saturating_cast,
    select_layers,
)
from paritygate.precision.spill import Kept, SpillFile, load_kept
from paritygate.precision.stats import (
    ActivationStats,
    ErrorStats,
    Pair,
    RelL2,
    compare,
    sum_squares,
)

Batch = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class LayerRecord:
    """Everything measured about one layer call, across dtypes."""

    key: str
    info: LayerInfo
    index: int
    depth: int
    """Parameterised leaf calls finished when this layer returns (for cumulative budgets)."""
    act: ActivationStats = field(default_factory=ActivationStats)
    local: dict[str, ErrorStats] = field(default_factory=dict)
    cum: dict[str, ErrorStats] = field(default_factory=dict)
    cum_in: dict[str, RelL2] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    """dtype -> why the local run of this layer failed."""


@dataclass
class PrecisionRun:
    """Raw measurements of one precision pass (accumulators, not yet judged)."""

    dtypes: list[str]
    layers: list[LayerRecord]
    output: dict[str, ErrorStats]
    reference_output_nonfinite: int
    depth: int
    errors: dict[str, str]
    """dtype -> why the whole-model low-precision forward failed."""
    notes: list[str]
    modules: dict[str, nn.Module]
    """layer name -> module (for the mixed-precision search)."""
    weights_beyond_range: dict[str, dict[str, int]] = field(default_factory=dict)
    """dtype -> parameter name -> how many of its values exceed the dtype's largest finite
    value (they become Inf when cast); parameters read from disk per layer are not counted."""


def weights_beyond_range(model: nn.Module, dtypes: list[str]) -> dict[str, dict[str, int]]:
    """Parameters whose values a cast to each dtype turns into Inf, by name and count."""
    limits = {dtype: torch.finfo(getattr(torch, dtype)).max for dtype in dtypes}
    out: dict[str, dict[str, int]] = {dtype: {} for dtype in dtypes}
    if not dtypes:
        return out
    smallest = min(limits.values(), default=math.inf)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_meta or not p.is_floating_point() or p.numel() == 0:
                continue
            low, high = torch.aminmax(p.detach())  # one pass; counted only past a limit
            if max(-float(low), float(high)) <= smallest:
                continue
            magnitude = p.detach().abs()
            for dtype, limit in limits.items():
                n = int((magnitude > limit).sum())
                if n:
                    out[dtype][name] = n
    return out


class _Keeper:
    """Copies low-precision tensors once; an output that is also an input shares one copy.

    A tensor is recognised by identity (a live weak reference) and its version
    counter, so a tensor changed in place after it was kept is copied again. With a
    spill file the copy goes there instead of into memory.
    """

    def __init__(self, spill: SpillFile | None = None) -> None:
        self._copies: dict[int, tuple[Any, int, Kept]] = {}
        self._spill = spill

    def __call__(self, t: torch.Tensor | None) -> Kept | None:
        if t is None:
            return None
        entry = self._copies.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            return entry[2]
        copy: Kept = t.detach().clone() if self._spill is None else self._spill.write(t)
        self._copies[id(t)] = (weakref.ref(t), t._version, copy)
        return copy


class _Pairs:
    """One batch's comparisons, by the identity of the fp32 tensor and of the kept candidate.

    A layer's input is usually the previous layer's output, an identity layer (dropout in eval)
    returns its input, and one fp32 output meets a candidate per dtype and per run: each pair is
    compared once, and each fp32 tensor's sum of squares computed once.
    """

    def __init__(self) -> None:
        self._pairs: dict[tuple[int, int], tuple[Any, int, object, bool, Pair]] = {}
        self._ref2: dict[int, tuple[Any, int, float]] = {}

    def _live(self, entry: tuple[Any, int, Any] | None, ref: torch.Tensor) -> bool:
        return entry is not None and entry[0]() is ref and entry[1] == ref._version

    def compare(
        self, ref: torch.Tensor, candidate: Kept | torch.Tensor, full: bool = True
    ) -> Pair:
        """``ref`` against ``candidate`` (a kept tensor, loaded only when not yet compared)."""
        key = (id(ref), id(candidate))
        entry = self._pairs.get(key)
        if self._live(entry, ref) and (entry[3] or not full):  # type: ignore[index]
            return entry[4]  # type: ignore[index]
        pair = compare(ref, load_kept(candidate), full, self.ref2(ref))
        self._pairs[key] = (weakref.ref(ref), ref._version, candidate, full, pair)
        return pair

    def ref2(self, ref: torch.Tensor) -> float:
        """Sum of squares of an fp32 tensor, computed once per tensor."""
        entry = self._ref2.get(id(ref))
        if self._live(entry, ref):
            return entry[2]  # type: ignore[index]
        value = sum_squares(ref)
        self._ref2[id(ref)] = (weakref.ref(ref), ref._version, value)
        return value


def _no_cache(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Turn a generation cache off: a cached layer rerun for its local error would append twice."""
    try:
        accepts = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts and "use_cache" not in kwargs:
        return {**kwargs, "use_cache": False}
    return kwargs


def _as_tensor(output: Any) -> torch.Tensor:
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"select_output returned {type(output).__name__}, not a tensor")
    return output.detach()


class _Pass:
    """State shared by the hooks of one batch."""

    def __init__(
        self,
        model: nn.Module,
        spec: PrecisionSpec,
        layers: dict[nn.Module, LayerInfo],
    ) -> None:
        self.model = model
        self.spill: SpillFile | None = None
        """The current batch's spill file (streamed models), set per batch."""
        self.pairs = _Pairs()
        """The current batch's comparisons, set per batch."""
        self.spec = spec
        self.layers = layers
        self.dtypes = list(spec.dtypes)
        self.records: dict[str, LayerRecord] = {}
        self.errors: dict[str, str] = {}
        self.notes: list[str] = []
        self.param_leaves = parameterised_leaves(model)
        self.leaf_calls = 0
        self.depth = 0
        self.onnx: Any = None
        self.in_local = False
        self.modules: dict[str, nn.Module] = {info.name: m for m, info in layers.items()}

    def low_precision(self, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: str) -> Any:
        """Cumulative run in ``dtype``: returns (stored per-layer tensors, selected output)."""
        tdtype = getattr(torch, dtype)
        keep = _Keeper(self.spill)
        store: dict[str, tuple[list[Kept], Kept | None]] = {}

        def on_call(
            key: str, info: LayerInfo, module: nn.Module, a: Any, kw: Any, out: Any
        ) -> None:
            inp = first_floating(a, kw)
            store[key] = ([keep(t) for t in floating_tensors(out)], keep(inp))

        cast = saturating_cast(tdtype)
        with LowPrecision(self.model, tdtype), Hooks(self.layers, on_call), torch.no_grad():
            out = self.model(*map_tensors(args, cast), **map_tensors(kwargs, cast))
        return store, out

    def reference(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stored: dict[str, dict[str, Any]],
        local: bool,
        first: bool,
    ) -> Any:
        """The fp32 run of one batch, folding every comparison into the layer records."""
        handles = []
        if first:
            for leaf in self.param_leaves:
                handles.append(leaf.register_forward_hook(self._count_leaf))
        hooks = Hooks(self.layers, lambda *call: self._on_reference(hooks, stored, local, *call))
        try:
            with hooks, torch.no_grad():
                return self.model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            if first:
                self.depth = self.leaf_calls

    def _count_leaf(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.in_local:
            self.leaf_calls += 1

    def _record(self, key: str, info: LayerInfo) -> LayerRecord:
        record = self.records.get(key)
        if record is None:
            record = LayerRecord(key, info, len(self.records), self.leaf_calls)
            for dtype in self.dtypes:
                record.local[dtype] = ErrorStats()
                record.cum[dtype] = ErrorStats()
                record.cum_in[dtype] = RelL2()
            self.records[key] = record
        return record

    def _on_reference(
        self,
        hooks: Hooks,
        stored: dict[str, dict[str, Any]],
        local: bool,
        key: str,
        info: LayerInfo,
        module: nn.Module,
        args: Any,
        kwargs: Any,
        output: Any,
    ) -> None:
        record = self._record(key, info)
        outputs = floating_tensors(output)
        if not outputs:
            return
        for t in outputs:
            record.act.update(t, self.dtypes)
        for dtype, store in stored.items():
            self._cumulative(record, dtype, store.get(key), outputs, first_floating(args, kwargs))
        if local and (module is self.model or not floating_tensors((args, kwargs))):
            # The root sees the probes themselves and a layer without floating inputs (an
            # embedding on token ids) inherits no error, so a low-precision rerun would repeat
            # the cumulative run exactly: the local error is the cumulative error.
            for dtype, store in stored.items():
                self._cumulative_as_local(record, dtype, store.get(key), outputs)
        elif local:
            hooks.paused = self.in_local = True
            try:
                for dtype in self.dtypes:
                    if dtype not in self.errors:
                        self._local(record, dtype, module, args, kwargs, outputs)
            finally:
                hooks.paused = self.in_local = False
        if self.onnx is not None:
            self.onnx.compare_layer(key, outputs)

    def _cumulative(
        self,
        record: LayerRecord,
        dtype: str,
        entry: tuple[list[Kept], Kept | None] | None,
        outputs: list[torch.Tensor],
        inp: torch.Tensor | None,
    ) -> None:
        if entry is None:
            self._note(
                f"{dtype}: layer {record.key!r} ran in fp32 but not in the low-precision run"
            )
            return
        lp_outputs, lp_inp = entry
        if [t.shape for t in lp_outputs] != [t.shape for t in outputs]:
            self._note(
                f"{dtype}: layer {record.key!r} output shapes differ between fp32 and {dtype}"
            )
            return
        for ref, cand in zip(outputs, lp_outputs, strict=True):
            record.cum[dtype].fold(self.pairs.compare(ref, cand))
        if inp is not None and lp_inp is not None and lp_inp.shape == inp.shape:
            record.cum_in[dtype].fold(self.pairs.compare(inp, lp_inp, full=False))

    def _cumulative_as_local(
        self,
        record: LayerRecord,
        dtype: str,
        entry: tuple[list[Kept], Kept | None] | None,
        outputs: list[torch.Tensor],
    ) -> None:
        if entry is None or [t.shape for t in entry[0]] != [t.shape for t in outputs]:
            return
        for ref, cand in zip(outputs, entry[0], strict=True):
            record.local[dtype].fold(self.pairs.compare(ref, cand))

    def _local(
        self,
        record: LayerRecord,
        dtype: str,
        module: nn.Module,
        args: Any,
        kwargs: Any,
        outputs: list[torch.Tensor],
    ) -> None:
        if dtype in record.errors:
            return
        tdtype = getattr(torch, dtype)
        cast = saturating_cast(tdtype)
        try:
            with LowPrecision(module, tdtype):
                out = module(*map_tensors(args, cast), **map_tensors(kwargs, cast))
        except Exception as exc:  # an op without a kernel for this dtype, a dtype clash
            record.errors[dtype] = f"{type(exc).__name__}: {exc}"
            return
        candidates = floating_tensors(out)
        if [t.shape for t in candidates] != [t.shape for t in outputs]:
            record.errors[dtype] = "output shapes differ from the fp32 run"
            return
        for ref, cand in zip(outputs, candidates, strict=True):
            record.local[dtype].fold(compare(ref, cand, ref2=self.pairs.ref2(ref)))

    def _note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 50:
            self.notes.append(text)


def measure_model(
    model: nn.Module,
    batches: list[Batch],
    select_output: Callable[[Any], Any],
    spec: PrecisionSpec,
    onnx: Any = None,
    spill: bool = False,
) -> PrecisionRun:
    """Run the precision pass over ``batches``; ``onnx`` is an optional ONNX comparison.

    ``spill``: keep the cumulative runs' tensors in a temporary file, not memory (streamed
    models, whose memory must not grow with depth)."""
    if spec.max_batches is not None:
        batches = batches[: spec.max_batches]
    state = _Pass(model, spec, select_layers(model, spec))
    state.onnx = onnx
    output = {dtype: ErrorStats() for dtype in state.dtypes}
    ref_nonfinite = 0
    for b, (args, kwargs) in enumerate(batches):
        kwargs = _no_cache(model, dict(kwargs))
        stored: dict[str, dict[str, Any]] = {}
        final: dict[str, Kept] = {}
        state.spill = SpillFile() if spill else None
        state.pairs = _Pairs()
        for dtype in state.dtypes:
            if dtype in state.errors:
                continue
            try:
                stored[dtype], out = state.low_precision(args, kwargs, dtype)
                selected = _as_tensor(select_output(out))
                del out
                final[dtype] = selected if state.spill is None else state.spill.write(selected)
            except Exception as exc:  # e.g. an op with no kernel for this dtype on this device
                state.errors[dtype] = f"{type(exc).__name__}: {exc}"
                stored.pop(dtype, None)
        if onnx is not None:
            onnx.run_batch(b)
        local = spec.local_max_batches is None or b < spec.local_max_batches
        out32 = _as_tensor(select_output(state.reference(args, kwargs, stored, local, b == 0)))
        ref_nonfinite += int((~torch.isfinite(out32)).sum())
        for dtype, cand in final.items():
            if cand.shape != out32.shape:
                state.errors[dtype] = (
                    f"output shape {tuple(cand.shape)} != fp32 {tuple(out32.shape)}"
                )
                continue
            output[dtype].update(out32, load_kept(cand))
        if onnx is not None:
            onnx.compare_output(out32)
            onnx.finish_batch()
        del stored, final
        if state.spill is not None:
            state.spill.close()
            state.spill = None
    return PrecisionRun(
        dtypes=state.dtypes,
        layers=sorted(state.records.values(), key=lambda r: r.index),
        output=output,
        reference_output_nonfinite=ref_nonfinite,
        depth=state.depth,
        errors=state.errors,
        notes=state.notes,
        modules=state.modules,
        # only needed to explain a non-finite layer output: no scan on a clean model
        weights_beyond_range=weights_beyond_range(model, [
            d for d in state.dtypes
            if any(r.local[d].nan + r.local[d].inf for r in state.records.values())
        ]),
    )  # fmt: skip
