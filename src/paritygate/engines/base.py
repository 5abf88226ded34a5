"""The engine contract for array-in, array-out policies.

An engine runs one side of the comparison and returns name-keyed arrays, so
everything downstream is keyed by output name. The causal-LM family adds a
generation protocol in :mod:`paritygate.lm.engine`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np


class Engine(Protocol):
    """``infer(feeds) -> {output name: array}``; ``name`` labels the side in reports."""

    name: str

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...
