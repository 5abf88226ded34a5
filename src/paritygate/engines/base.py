"""The two engine protocols: every engine runs one side of a comparison.

- :class:`TensorEngine` (torch, ONNX Runtime): name-keyed arrays in, name-keyed arrays
  out, so everything downstream is keyed by output name.
- :class:`GenerationEngine` (HF ``generate``, vLLM): prompt token ids in, a
  :class:`~paritygate.engines.generation.Generation` (tokens and their log-probs) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from paritygate.engines.generation import Generation, SamplingSpec


@runtime_checkable
class TensorEngine(Protocol):
    """``infer(feeds) -> {output name: array}``; ``name`` labels the side in reports."""

    name: str

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@runtime_checkable
class GenerationEngine(Protocol):
    """Anything that generates continuations and reports per-token log-probs."""

    name: str

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> Generation: ...


def take_rows(feeds: Mapping[str, np.ndarray], index: slice | np.ndarray) -> dict[str, np.ndarray]:
    """The rows ``index`` (a slice or an index array) of every feed."""
    return {name: value[index] for name, value in feeds.items()}


def feed_rows(feeds: Mapping[str, np.ndarray]) -> int:
    """The batch size of a set of feeds (their common first axis)."""
    return len(next(iter(feeds.values())))
