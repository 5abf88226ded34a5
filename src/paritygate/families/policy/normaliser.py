"""An observation normaliser inside the training model that the artifact does not apply.

A policy that normalises its observations itself (a ``RunningMeanStd``-style module holding
mean and variance buffers, called on the raw input) is often exported from a forward that skips
it: the buffers are stored in the artifact, unused, and the artifact computes the network on
raw observations. :func:`normaliser_skipped` runs the training model once per such module with
that module bypassed (its output replaced by its input) and says which one, if any, makes the
training model compute what the artifact serves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import nn

STAT_NAMES = re.compile(r"(^|_)(mean|mu|var|variance|std|sigma|rms|count|loc|scale)s?($|_)",
                        re.IGNORECASE)
"""Buffer or parameter names of an observation normaliser's statistics."""
MAX_CANDIDATES = 4


@dataclass(frozen=True)
class SkippedNormaliser:
    """The module whose bypass reproduces the artifact's outputs."""

    module: str
    statistics: list[str]
    max_abs_diff: float
    """The artifact's outputs vs the training model with the module bypassed."""


def candidates(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """Leaf-like submodules holding normaliser statistics (not a BatchNorm / LayerNorm /
    GroupNorm, whose bypass is other checks' finding), with those statistics' names."""
    import torch

    skip = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm,
            torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    found = []
    for name, module in model.named_modules():
        if not name or isinstance(module, skip):
            continue
        tensors = [*module.named_buffers(recurse=False), *module.named_parameters(recurse=False)]
        stats = [n for n, t in tensors if t is not None and t.is_floating_point()
                 and STAT_NAMES.search(n)]
        if stats and not any(isinstance(c, skip) for c in module.modules()):
            found.append((name, module, stats))
    return found[:MAX_CANDIDATES]


def normaliser_skipped(model: nn.Module, run: Callable[[], np.ndarray], served: np.ndarray,
                       limit: float) -> SkippedNormaliser | None:
    """The normaliser module whose bypass makes ``run()`` (the training model's policy output
    on the probes) match ``served`` within ``limit``; ``None`` when none does. A module whose
    output has another shape than its input is never bypassed."""
    def identity(module: nn.Module, args: tuple[object, ...], output: object) -> object:
        first = args[0] if args else None
        same = getattr(first, "shape", None) == getattr(output, "shape", None)
        return first if same and first is not None else output

    for name, module, stats in candidates(model):
        handle = module.register_forward_hook(identity)
        try:
            bypassed = np.asarray(run(), np.float64)
        except Exception:  # a bypass the model cannot run with is not the artifact's
            continue
        finally:
            handle.remove()
        if bypassed.shape != served.shape or not np.isfinite(bypassed).all():
            continue
        diff = float(np.max(np.abs(bypassed - served))) if served.size else 0.0
        if diff <= limit:
            return SkippedNormaliser(name, stats, diff)
    return None
