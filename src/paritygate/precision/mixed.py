"""Mixed-precision suggestion: the smallest layers that, kept in fp32, bring the output in budget.

Greedy on the measured sensitivity (layers ranked by local error over budget,
non-finite first), each step verified by running the model with those layers
in fp32, then pruned (every chosen layer whose removal still passes is dropped)
and refined (a chosen layer is replaced by a layer inside it that still passes,
most sensitive first, down to the smallest). Layers that hold most of the model
(a decoder, an encoder: more than half of the measured leaf layers) are tried
only after every smaller one: keeping them in fp32 always passes and fixes
nothing, so they are suggested only when nothing smaller verifies. Every
reported set has been run and measured; it is the smallest set found within
``max_runs`` verification runs, not a proven minimum.

A mixed run is verified the way a low-precision runtime runs a graph with some
nodes pinned to fp32: a kept layer computes in fp32 on fp32 copies of its
inputs and hands its output on in the low dtype (low-precision hand-offs, also
between two kept layers); every other module casts its floating inputs to the
low dtype without saturation (:class:`~paritygate.precision.hooks.LowPrecision`).
The assumption: the runtime keeps the tensors between nodes in the low dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paritygate.precision.hooks import LowPrecision, map_tensors, saturating_cast
from paritygate.precision.memo import output_tensor
from paritygate.precision.stats import ErrorStats

Batch = tuple[tuple[object, ...], Mapping[str, object]]


@dataclass
class MixedSuggestion:
    """Result of the search for one dtype."""

    dtype: str
    keep_fp32: list[str]
    output_rel_l2: float | None
    """Verified output error with ``keep_fp32`` in fp32 (None when no passing set was found)."""
    budget: float
    verified: bool
    runs: int
    tried: list[dict[str, Any]] = field(default_factory=list)


LARGE_SHARE = 0.5
"""A layer holding more than this share of the measured leaf layers is kept in fp32 only
when nothing smaller verifies."""


def _inside(name: str, block: str) -> bool:
    return block == "" or name == block or name.startswith(block + ".")


class MixedRunner:
    """Runs the model in ``dtype`` with a chosen set of modules kept in fp32."""

    def __init__(
        self,
        model: nn.Module,
        batches: Sequence[Batch],
        select_output: Callable[[Any], object],
        modules: dict[str, nn.Module],
    ) -> None:
        self.model = model
        self.batches = batches
        self.select_output = select_output
        self.modules = modules
        self._reference: list[torch.Tensor] | None = None
        parts = [name.split(".") for name in modules if name]
        parents = {"", *(".".join(p[:i]) for p in parts for i in range(1, len(p)))}
        self._leaves = [name for name in modules if name not in parents]

    def share(self, name: str) -> float:
        """The share of the measured leaf layers that module ``name`` holds (1.0: all)."""
        if not self._leaves:
            return 0.0
        return sum(_inside(leaf, name) for leaf in self._leaves) / len(self._leaves)

    def reference(self) -> list[torch.Tensor]:
        if self._reference is None:
            with torch.no_grad():
                self._reference = [
                    output_tensor(self.select_output(self.model(*a, **kw))).float()
                    for a, kw in self.batches
                ]
        return self._reference

    def output_error(self, dtype: str, keep: list[str]) -> ErrorStats:
        """Output error of the model in ``dtype`` with the modules named in ``keep`` in fp32."""
        references = self.reference()
        tdtype = getattr(torch, dtype)
        kept = [self.modules[name] for name in keep]
        stats = ErrorStats()
        to_low = saturating_cast(tdtype)
        with LowPrecision(self.model, tdtype, keep=kept), torch.no_grad():
            for (args, kwargs), ref in zip(self.batches, references, strict=True):
                out = self.model(*map_tensors(args, to_low), **map_tensors(kwargs, to_low))
                stats.update(ref, output_tensor(self.select_output(out)))
        return stats


def _passes(stats: ErrorStats, budget: float) -> bool:
    return stats.nan == 0 and stats.inf == 0 and stats.rel_l2 <= budget


def suggest_mixed(
    runner: MixedRunner,
    dtype: str,
    ranked: list[str],
    budget: float,
    max_runs: int,
) -> MixedSuggestion:
    """Greedy, pruned, then refined search over ``ranked`` (most sensitive first) for ``dtype``.

    Layers holding most of the model come last, after every smaller layer, whatever their
    rank; one run each stays reserved for them while smaller layers are tried."""
    result = MixedSuggestion(dtype, [], None, budget, False, 0)

    def attempt(keep: list[str]) -> ErrorStats | None:
        result.runs += 1
        try:
            stats = runner.output_error(dtype, keep)
        except Exception as exc:  # a dtype clash where a kept layer meets a low-precision op
            result.tried.append({"keep_fp32": keep, "error": f"{type(exc).__name__}: {exc}"})
            return None
        result.tried.append(
            {"keep_fp32": keep, "output_rel_l2": stats.rel_l2, "nonfinite": stats.nan + stats.inf}
        )
        return stats

    large = [name for name in ranked if runner.share(name) > LARGE_SHARE]
    order = [name for name in ranked if name not in large] + large
    chosen: list[str] = []
    best: ErrorStats | None = None
    for name in order:
        reserve = len(large) if name not in large else 0  # runs left for the fallback
        if result.runs >= max_runs - reserve:
            if reserve:
                continue
            break
        if any(_inside(name, c) for c in chosen):
            continue
        trial = [c for c in chosen if not _inside(c, name)] + [name]
        stats = attempt(trial)
        if stats is None:
            continue
        chosen = trial
        if _passes(stats, budget):
            best = stats
            break
    if best is None:
        result.keep_fp32 = chosen
        return result
    for name in list(chosen):
        if result.runs >= max_runs or len(chosen) == 1:
            break
        trial = [c for c in chosen if c != name]
        stats = attempt(trial)
        if stats is not None and _passes(stats, budget):
            chosen, best = trial, stats
    # Refine: replace a chosen layer by the most sensitive layer inside it that still passes.
    pending = list(chosen)
    while pending and result.runs < max_runs:
        outer = pending.pop(0)
        for inner in order:
            if result.runs >= max_runs:
                break
            if inner == outer or not _inside(inner, outer):
                continue
            trial = [inner if c == outer else c for c in chosen]
            stats = attempt(trial)
            if stats is not None and _passes(stats, budget):
                chosen, best = trial, stats
                pending.insert(0, inner)
                break
    result.keep_fp32 = chosen
    result.output_rel_l2 = best.rel_l2
    result.verified = True
    return result
