"""What one batch of the precision pass keeps between its forwards: the fp32 run's tensors
(as they are, copied, or spilled), its layer calls, and the comparisons already made."""

from __future__ import annotations

import inspect
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from paritygate.precision.hooks import map_tensors
from paritygate.precision.spill import Kept, Spilled, SpillFile, map_kept
from paritygate.precision.stats import Pair, compare, sum_squares

T = TypeVar("T")


def same_tensor(ref: weakref.ref[torch.Tensor], version: int, t: torch.Tensor) -> bool:
    """Whether a memo entry's weak reference and version still stand for ``t``: the same live
    tensor, unchanged since (an id alone may be reused by a later tensor)."""
    return ref() is t and version == t._version


class KeptTensors:
    """The fp32 tensors of one batch's reference run, kept for the low-precision runs.

    A tensor is kept once, however many calls see it (a layer's output is the
    next layer's input), and as it is: no copy, its version counter noted so a
    later in-place change is detected (:meth:`changed`). With ``copy`` each tensor
    is cloned instead, and with a spill file written there (streamed models) and
    read back on use, the last few reads cached so a tensor read for one layer's
    output is the same object as the next layer's input.
    """

    def __init__(self, spill: SpillFile | None = None, copy: bool = False) -> None:
        self._kept: dict[int, tuple[weakref.ref[torch.Tensor], int, Kept]] = {}
        self._held: list[tuple[torch.Tensor, int]] = []
        """Every tensor kept as it is, with its version when kept."""
        self._spill = spill
        self._copy = copy
        self._loaded: OrderedDict[int, torch.Tensor] = OrderedDict()

    def keep(self, t: torch.Tensor) -> Kept:
        entry = self._kept.get(id(t))
        if entry is not None and same_tensor(entry[0], entry[1], t):
            return entry[2]
        kept: Kept = t
        if self._spill is not None:
            kept = self._spill.write(t)
        elif self._copy:
            kept = t.clone()
        else:
            self._held.append((t, t._version))
        self._kept[id(t)] = (weakref.ref(t), t._version, kept)
        return kept

    def tree(self, obj: T) -> T:
        """``obj`` (nested args or kwargs) with every tensor kept."""
        return map_tensors(obj, self.keep, every=True)

    def changed(self) -> bool:
        """Whether the forward changed a kept tensor in place after it was kept."""
        return any(t._version != version for t, version in self._held)

    def load(self, kept: Kept) -> torch.Tensor:
        if not isinstance(kept, Spilled):
            return kept
        value = self._loaded.get(id(kept))
        if value is None:
            value = self._loaded[id(kept)] = kept.load()
            if len(self._loaded) > 8:
                self._loaded.popitem(last=False)
        else:
            self._loaded.move_to_end(id(kept))
        return value

    def load_tree(self, obj: T) -> T:
        return map_kept(obj, self.load)

    def close(self) -> None:
        """Drop the spill file, if any (the batch is done)."""
        if self._spill is not None:
            self._spill.close()


@dataclass
class LayerCall:
    """One layer call of the fp32 run: its inputs and floating outputs, kept."""

    args: tuple[object, ...] | None
    """Kept for a local rerun only (else ``None``), as are ``kwargs``."""
    kwargs: dict[str, object] | None
    outputs: list[Kept]
    inp: Kept | None
    plain: bool
    """The root, or a layer without floating inputs (an embedding on token ids): it inherits
    no error, so its local error is its cumulative error."""
    in_peak: float = 0.0
    """Largest |value| of the main input (for a local rerun: beyond a dtype's range it is
    clamped)."""


class Pairs:
    """One batch's comparisons, by the identity of the fp32 tensor and of the candidate.

    A layer's input is usually the previous layer's output, an identity layer (dropout in eval)
    returns its input, and one fp32 output meets a candidate per dtype: each pair is compared
    once, and each fp32 tensor's sum of squares computed once. Entries hold weak references,
    so an id reused by a later tensor never matches.
    """

    def __init__(self) -> None:
        self._pairs: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], int,
                                                  weakref.ref[torch.Tensor], int, bool, Pair]] = {}
        self._ref2: dict[int, tuple[weakref.ref[torch.Tensor], int, float]] = {}

    def compare(self, ref: torch.Tensor, candidate: torch.Tensor, full: bool = True) -> Pair:
        """``ref`` against ``candidate``, computed once per pair."""
        key = (id(ref), id(candidate))
        entry = self._pairs.get(key)
        if (
            entry is not None
            and same_tensor(entry[0], entry[1], ref)
            and same_tensor(entry[2], entry[3], candidate)
            and (entry[4] or not full)
        ):
            return entry[5]
        pair = compare(ref, candidate, full, self.ref2(ref))
        self._pairs[key] = (
            weakref.ref(ref), ref._version, weakref.ref(candidate), candidate._version, full, pair
        )  # fmt: skip
        return pair

    def ref2(self, ref: torch.Tensor) -> float:
        """Sum of squares of an fp32 tensor, computed once per tensor."""
        entry = self._ref2.get(id(ref))
        if entry is not None and same_tensor(entry[0], entry[1], ref):
            return entry[2]
        value = sum_squares(ref)
        self._ref2[id(ref)] = (weakref.ref(ref), ref._version, value)
        return value


def input_peak(t: torch.Tensor) -> float:
    """Largest |value| of a layer's main input (inf when it holds Inf). Its masks are not
    counted: an additive mask at float32's lowest value is clamped by design."""
    if not t.numel():
        return 0.0
    low, high = torch.aminmax(t.detach())
    return max(-float(low), float(high))


def without_cache(model: nn.Module, kwargs: dict[str, object]) -> dict[str, object]:
    """Turn a generation cache off: a cached layer rerun for its local error would append twice."""
    try:
        accepts = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts and "use_cache" not in kwargs:
        return {**kwargs, "use_cache": False}
    return kwargs


def output_tensor(output: object) -> torch.Tensor:
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"select_output returned {type(output).__name__}, not a tensor")
    return output.detach()
