"""Mixed-precision suggestion: the fewest layers that, kept in fp32, bring the output under budget.

Greedy on the measured sensitivity (layers ranked by local error over budget,
non-finite first), each step verified by running the model with those layers
in fp32, then pruned: every chosen layer whose removal still passes is
dropped. Every reported set has been run and measured; it is the smallest set
found within ``max_runs`` verification runs, not a proven minimum.

In a mixed run a kept layer computes in fp32 on fp32 copies of its inputs and
hands fp32 on; every other leaf casts its floating inputs to the low dtype
(without saturation, as a real mixed model would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paritygate.precision.hooks import cast_params, map_tensors
from paritygate.precision.stats import ErrorStats

Batch = tuple[tuple[Any, ...], dict[str, Any]]


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


def _inside(name: str, block: str) -> bool:
    return name == block or name.startswith(block + ".")


class MixedRunner:
    """Runs the model in ``dtype`` with a chosen set of modules kept in fp32."""

    def __init__(
        self,
        model: nn.Module,
        batches: Sequence[Batch],
        select_output: Callable[[Any], Any],
        modules: dict[str, nn.Module],
    ) -> None:
        self.model = model
        self.batches = batches
        self.select_output = select_output
        self.modules = modules
        self._reference: list[torch.Tensor] | None = None

    def reference(self) -> list[torch.Tensor]:
        if self._reference is None:
            with torch.no_grad():
                self._reference = [
                    self.select_output(self.model(*a, **kw)).detach().float()
                    for a, kw in self.batches
                ]
        return self._reference

    def output_error(self, dtype: str, keep: list[str]) -> ErrorStats:
        """Output error of the model in ``dtype`` with the modules named in ``keep`` in fp32."""
        references = self.reference()
        tdtype = getattr(torch, dtype)
        kept = [self.modules[name] for name in keep]
        kept_ids = {id(m) for k in kept for m in k.modules()}
        handles = [
            m.register_forward_pre_hook(_caster(torch.float32), with_kwargs=True) for m in kept
        ]
        for m in self.model.modules():
            if id(m) not in kept_ids and not any(True for _ in m.children()):
                handles.append(m.register_forward_pre_hook(_caster(tdtype), with_kwargs=True))
        stats = ErrorStats()
        restore = cast_params(self.model, tdtype, keep=kept)
        try:
            with torch.no_grad():
                for (args, kwargs), ref in zip(self.batches, references, strict=True):
                    to_low = _cast_fn(tdtype)
                    out = self.model(*map_tensors(args, to_low), **map_tensors(kwargs, to_low))
                    stats.update(ref, self.select_output(out).detach())
        finally:
            restore()
            for handle in handles:
                handle.remove()
        return stats


def _cast_fn(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.to(dtype)


def _caster(dtype: torch.dtype) -> Callable[..., Any]:
    cast = _cast_fn(dtype)

    def pre_hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        return map_tensors(args, cast), map_tensors(kwargs, cast)

    return pre_hook


def _passes(stats: ErrorStats, budget: float) -> bool:
    return stats.nan == 0 and stats.inf == 0 and stats.rel_l2 <= budget


def suggest_mixed(
    runner: MixedRunner,
    dtype: str,
    ranked: list[str],
    budget: float,
    max_runs: int,
) -> MixedSuggestion:
    """Greedy-then-pruned search over ``ranked`` (most sensitive first) for ``dtype``."""
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

    chosen: list[str] = []
    best: ErrorStats | None = None
    for name in ranked:
        if result.runs >= max_runs:
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
    result.keep_fp32 = chosen
    result.output_rel_l2 = best.rel_l2
    result.verified = True
    return result
