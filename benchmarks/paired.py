"""Paired timing for the benchmarks: the check and the minimal work it is held against, run
alternately in one process so both see the same machine."""

from __future__ import annotations

import time
from collections.abc import Callable


def paired_times(minimal: Callable[[], object], check: Callable[[], object],
                 repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of ``minimal`` and of ``check`` per repeat, after one warm-up call of each; the
    order alternates every repeat so neither side always runs on a warmer cache."""
    minimal()
    check()
    t_min: list[float] = []
    t_chk: list[float] = []
    for i in range(repeats):
        pair = ((minimal, t_min), (check, t_chk))
        for fn, times in pair if i % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return t_min, t_chk
