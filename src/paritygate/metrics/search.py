"""One-dimensional minimisation shared by the log-prob fits (temperature ratio, penalties)."""

from __future__ import annotations

import math
from collections.abc import Callable


def golden_section(fn: Callable[[float], float], lo: float, hi: float, steps: int = 48) -> float:
    """The minimiser of the unimodal ``fn`` on ``[lo, hi]`` by golden-section search: each
    step keeps 61.8% of the interval, so 48 steps narrow it by ~1e-10."""
    g = (math.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = fn(c), fn(d)
    for _ in range(steps):
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - g * (hi - lo)
            fc = fn(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + g * (hi - lo)
            fd = fn(d)
    return (lo + hi) / 2
