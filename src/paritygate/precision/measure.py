"""The precision pass: per batch, one fp32 forward, then one low-precision forward per dtype.

For each probe batch:

1. The model runs once in fp32. Each measured layer's hook folds its activation
   range into the layer's record and keeps the call: its inputs (for the local
   reruns) and its floating outputs. Nothing is copied: the tensors are kept as
   they are, and a tensor the forward changes in place later is detected by its
   version counter, in which case the forward runs again keeping copies.
2. For each dtype, the model's parameters are cast in place once, every module's
   floating inputs are cast to its dtype (integer inputs never are), and the
   batch runs once with hooks: the *cumulative* run (every layer inherits the
   error of the layers before it). At each layer's hook its output and main input
   are compared with the fp32 ones (cumulative error, and the amplification), and
   the layer alone is rerun, under the same cast weights, on its fp32 inputs cast
   to the dtype: its *local* error, with inherited error excluded.

Each dtype's weights are cast once per batch, whatever the nesting of the measured
layers, and the low-precision tensors are compared when they are made, never
kept. The batch's fp32 tensors are then dropped; nothing but accumulators
survives a batch. The model exists once in fp32, plus one low-precision copy of
its weights during step 2. A streamed model keeps the fp32 tensors in a spill
file instead of memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
from paritygate.precision.memo import (
    KeptTensors,
    LayerCall,
    Pairs,
    input_peak,
    output_tensor,
    without_cache,
)
from paritygate.precision.spill import SpillFile
from paritygate.precision.stats import (
    ActivationStats,
    ErrorStats,
    RelL2,
    compare,
)

if TYPE_CHECKING:
    from paritygate.precision.onnx_compare import OnnxComparison

Batch = tuple[tuple[object, ...], Mapping[str, object]]
"""A probe batch: positional and keyword arguments of the model's forward."""


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
    clamped: dict[str, bool] = field(default_factory=dict)
    """dtype -> the layer's fp32 input exceeded the dtype's range: its local rerun saw the
    input clamped, so its local error is the clipping it inherits, not its own."""


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


class _Pass:
    """State shared by the hooks of one batch."""

    def __init__(
        self,
        model: nn.Module,
        spec: PrecisionSpec,
        layers: dict[nn.Module, LayerInfo],
    ) -> None:
        self.model = model
        self.spec = spec
        self.layers = layers
        self.dtypes = list(spec.dtypes)
        self.records: dict[str, LayerRecord] = {}
        self.errors: dict[str, str] = {}
        self.notes: list[str] = []
        self.param_leaves = parameterised_leaves(model)
        self.leaf_calls = 0
        self.depth = 0
        self.onnx: OnnxComparison | None = None
        self.modules: dict[str, nn.Module] = {info.name: m for m, info in layers.items()}
        self.kept = KeptTensors()
        """The current batch's fp32 tensors."""
        self.calls: dict[str, LayerCall] = {}
        """The current batch's fp32 layer calls, by key."""
        self.pairs = Pairs()
        """The current batch's comparisons."""

    def reference(
        self,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        local: bool,
        first: bool,
        spill: bool,
    ) -> object:
        """The fp32 run of one batch: activation ranges, ONNX layers, and the calls kept."""
        handles = []
        if first:
            for leaf in self.param_leaves:
                handles.append(leaf.register_forward_hook(self._count_leaf))
        self.kept = KeptTensors(SpillFile() if spill else None)
        self.calls = {}
        self.pairs = Pairs()
        hooks = self._reference_hooks(local, measure=True)
        try:
            with hooks, torch.no_grad():
                out = self.model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            if first:
                self.depth = self.leaf_calls
        if self.kept.changed():
            # an in-place op changed a kept tensor after its layer returned: keep copies
            self.kept, self.calls = KeptTensors(copy=True), {}
            with self._reference_hooks(local, measure=False), torch.no_grad():
                out = self.model(*args, **kwargs)
        return out

    def _reference_hooks(self, local: bool, measure: bool) -> Hooks:
        return Hooks(
            self.layers,
            on_enter=lambda *call: self._enter_reference(local, *call),
            on_call=lambda *call: self._on_reference(measure, *call),
        )

    def end_batch(self) -> None:
        self.kept.close()
        self.kept, self.calls, self.pairs = KeptTensors(), {}, Pairs()

    def _count_leaf(self, module: nn.Module, args: tuple[object, ...], output: object) -> None:
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

    def _enter_reference(
        self, local: bool, key: str, info: LayerInfo, module: nn.Module,
        args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """Keep a call's inputs before the module runs (it may change them in place)."""
        plain = module is self.model or not floating_tensors((args, kwargs))
        rerun = local and not plain
        inp = first_floating(args, kwargs)
        self.calls[key] = LayerCall(
            args=self.kept.tree(args) if rerun else None,
            kwargs=self.kept.tree(kwargs) if rerun else None,
            outputs=[],
            inp=None if inp is None else self.kept.keep(inp),
            plain=plain,
            in_peak=input_peak(inp) if rerun and inp is not None else 0.0,
        )

    def _on_reference(
        self,
        measure: bool,
        key: str,
        info: LayerInfo,
        module: nn.Module,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        output: object,
    ) -> None:
        record = self._record(key, info)
        outputs = floating_tensors(output)
        if not outputs:
            del self.calls[key]
            return
        if measure:
            for t in outputs:
                record.act.update(t, self.dtypes)
            if self.onnx is not None:
                self.onnx.compare_layer(key, outputs)
        self.calls[key].outputs = [self.kept.keep(t) for t in outputs]

    def low_precision(
        self, args: tuple[object, ...], kwargs: dict[str, object], dtype: str, local: bool
    ) -> object:
        """The cumulative run in ``dtype``, each layer compared, and rerun alone, as it returns."""
        tdtype = getattr(torch, dtype)
        cast = saturating_cast(tdtype)
        seen: set[str] = set()
        hooks = Hooks(
            self.layers,
            on_enter=lambda *call: self._enter_low(dtype, seen, *call),
            on_call=lambda *call: self._on_low(hooks, dtype, local, *call),
        )
        with LowPrecision(self.model, tdtype), hooks, torch.no_grad():
            out = self.model(*map_tensors(args, cast), **map_tensors(kwargs, cast))
        for key in [k for k in self.calls if k not in seen]:
            self._note(f"{dtype}: layer {key!r} ran in fp32 but not in the low-precision run")
        return out

    def _enter_low(
        self,
        dtype: str,
        seen: set[str],
        key: str,
        info: LayerInfo,
        module: nn.Module,
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> None:
        """The inherited error of a call's input, compared before the module can change it."""
        seen.add(key)
        call = self.calls.get(key)
        if call is None:
            if key not in self.records:
                self._note(f"{dtype}: layer {key!r} ran in {dtype} but not in the fp32 run")
            return
        inp = first_floating(args, kwargs)
        if inp is not None and call.inp is not None and call.inp.shape == inp.shape:
            record = self.records[key]
            record.cum_in[dtype].fold(self.pairs.compare(self.kept.load(call.inp), inp, False))

    def _on_low(
        self,
        hooks: Hooks,
        dtype: str,
        local: bool,
        key: str,
        info: LayerInfo,
        module: nn.Module,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        output: object,
    ) -> None:
        call = self.calls.get(key)
        if call is None:
            return
        record = self.records[key]
        refs = [self.kept.load(t) for t in call.outputs]
        candidates = floating_tensors(output)
        if [t.shape for t in candidates] != [t.shape for t in refs]:
            self._note(f"{dtype}: layer {key!r} output shapes differ between fp32 and {dtype}")
            return
        for ref, cand in zip(refs, candidates, strict=True):
            record.cum[dtype].fold(self.pairs.compare(ref, cand))
        if not local:
            return
        if call.plain:
            for ref, cand in zip(refs, candidates, strict=True):
                record.local[dtype].fold(self.pairs.compare(ref, cand))
            return
        hooks.paused = True
        try:
            self._local(record, dtype, module, call, refs)
        finally:
            hooks.paused = False

    def _local(
        self,
        record: LayerRecord,
        dtype: str,
        module: nn.Module,
        call: LayerCall,
        refs: list[torch.Tensor],
    ) -> None:
        """``module`` alone, under the dtype's cast weights, on its fp32 inputs cast."""
        if dtype in record.errors:
            return
        tdtype = getattr(torch, dtype)
        if call.in_peak > torch.finfo(tdtype).max:
            record.clamped[dtype] = True
        cast = saturating_cast(tdtype)
        assert call.args is not None and call.kwargs is not None  # kept for a local rerun
        try:
            args = map_tensors(self.kept.load_tree(call.args), cast)
            kwargs = map_tensors(self.kept.load_tree(call.kwargs), cast)
            out = module(*args, **kwargs)
        except Exception as exc:  # an op without a kernel for this dtype, a dtype clash
            record.errors[dtype] = f"{type(exc).__name__}: {exc}"
            return
        candidates = floating_tensors(out)
        if [t.shape for t in candidates] != [t.shape for t in refs]:
            record.errors[dtype] = "output shapes differ from the fp32 run"
            return
        for ref, cand in zip(refs, candidates, strict=True):
            record.local[dtype].fold(compare(ref, cand, ref2=self.pairs.ref2(ref)))

    def _note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 50:
            self.notes.append(text)


def measure_model(
    model: nn.Module,
    batches: Sequence[Batch],
    select_output: Callable[[object], object],
    spec: PrecisionSpec,
    onnx: OnnxComparison | None = None,
    spill: bool = False,
) -> PrecisionRun:
    """Run the precision pass over ``batches``; ``onnx`` is an optional ONNX comparison.

    ``spill``: keep the fp32 run's tensors in a temporary file, not memory (streamed
    models, whose memory must not grow with depth)."""
    if spec.max_batches is not None:
        batches = batches[: spec.max_batches]
    state = _Pass(model, spec, select_layers(model, spec))
    state.onnx = onnx
    output = {dtype: ErrorStats() for dtype in state.dtypes}
    ref_nonfinite = 0
    for b, (args, kwargs) in enumerate(batches):
        kwargs = without_cache(model, dict(kwargs))
        local = spec.local_max_batches is None or b < spec.local_max_batches
        if onnx is not None:
            onnx.run_batch(b)
        try:
            ref = state.reference(args, kwargs, local, b == 0, spill)
            out32 = output_tensor(select_output(ref))
            ref_nonfinite += int((~torch.isfinite(out32)).sum())
            if onnx is not None:
                onnx.compare_output(out32)
                onnx.finish_batch()
            for dtype in state.dtypes:
                if dtype in state.errors:
                    continue
                try:
                    out = state.low_precision(args, kwargs, dtype, local)
                    candidate = output_tensor(select_output(out))
                    del out
                except Exception as exc:  # e.g. an op with no kernel for this dtype here
                    state.errors[dtype] = f"{type(exc).__name__}: {exc}"
                    continue
                if candidate.shape != out32.shape:
                    state.errors[dtype] = (
                        f"output shape {tuple(candidate.shape)} != fp32 {tuple(out32.shape)}"
                    )
                    continue
                output[dtype].update(out32, candidate)
                del candidate
        finally:
            state.end_batch()
    return PrecisionRun(
        dtypes=list(state.dtypes),
        layers=sorted(state.records.values(), key=lambda r: r.index),
        output={str(k): v for k, v in output.items()},
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
