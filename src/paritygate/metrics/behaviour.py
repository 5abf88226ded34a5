"""Two-sample statistics for sampled behaviour (numpy only): rank test, proportions, Holm,
bootstrap interval of a difference of means, distinct-n diversity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _two_sided(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def mann_whitney(reference: Sequence[float], candidate: Sequence[float]) -> tuple[float, float]:
    """Mann–Whitney U test, normal approximation with tie correction: ``(effect, p)``, the
    effect the rank-biserial correlation ``2 U / (n m) - 1`` (positive: candidate larger)."""
    x = np.asarray(reference, dtype=np.float64)
    y = np.asarray(candidate, dtype=np.float64)
    n, m = x.size, y.size
    if n == 0 or m == 0:
        return 0.0, 1.0
    both = np.concatenate([x, y])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(n + m)
    sorted_values = both[order]
    i = 0
    ties = 0.0
    while i < n + m:  # average ranks over ties
        j = i
        while j + 1 < n + m and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    u = float(ranks[n:].sum() - m * (m + 1) / 2.0)  # U of the candidate
    mean = n * m / 2.0
    var = n * m / 12.0 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    effect = 2.0 * u / (n * m) - 1.0
    if var <= 0:
        return effect, 1.0
    z = (u - mean - math.copysign(0.5, u - mean) * (u != mean)) / math.sqrt(var)
    return effect, _two_sided(z)


def two_proportions(ref_hits: int, ref_n: int, cand_hits: int, cand_n: int) -> tuple[float, float]:
    """Pooled two-proportion z test: ``(candidate rate - reference rate, p)``."""
    if ref_n == 0 or cand_n == 0:
        return 0.0, 1.0
    p1, p2 = ref_hits / ref_n, cand_hits / cand_n
    pooled = (ref_hits + cand_hits) / (ref_n + cand_n)
    var = pooled * (1 - pooled) * (1 / ref_n + 1 / cand_n)
    if var <= 0:
        return p2 - p1, 1.0
    return p2 - p1, _two_sided((p2 - p1) / math.sqrt(var))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def bootstrap_diff(reference: Sequence[float], candidate: Sequence[float], *, seed: int,
                   resamples: int = 2000, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean difference, low, high)``: the percentile bootstrap interval of
    ``mean(candidate) - mean(reference)``."""
    x = np.asarray(reference, dtype=np.float64)
    y = np.asarray(candidate, dtype=np.float64)
    rng = np.random.default_rng(seed)
    xs = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
    ys = y[rng.integers(0, y.size, (resamples, y.size))].mean(axis=1)
    diffs = ys - xs
    tail = (1.0 - level) / 2.0
    return float(y.mean() - x.mean()), float(np.quantile(diffs, tail)), float(
        np.quantile(diffs, 1.0 - tail))


def distinct_n(samples: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams over all n-grams of one prompt's samples (1.0 when none)."""
    grams = [tuple(s[i : i + n]) for s in samples for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


@dataclass(frozen=True)
class SideSample:
    """One side's samples, reduced to what the tests read."""

    lengths: list[int]
    truncated: list[bool]
    """The sample hit its side's length limit (no EOS, no stop string)."""
    diversity: list[float]
    """distinct-2 of each prompt's samples."""
    logprob_means: list[float]
    """The training model's mean raw log-prob per token of each sample."""
    score_sum: float
    """Sum over every token of ``log p(token) + H(p)`` under the training model."""
    score_var: float
    """Sum over every token of the varentropy ``Var_p[log p]``."""
    format_hits: list[bool] | None = None


def compare(
    reference: SideSample, candidate: SideSample, alpha: float
) -> dict[str, dict[str, Any]]:
    """Each statistic's test, p-value, effect, side values and Holm rejection at ``alpha``."""
    stats: dict[str, dict[str, Any]] = {}
    for name, ref, cand in (("length", reference.lengths, candidate.lengths),
                            ("distinct_2", reference.diversity, candidate.diversity)):
        effect, p = mann_whitney(ref, cand)
        stats[name] = {"test": "Mann-Whitney", "p": p, "effect": effect,
                       "training": float(np.mean(ref)), "serving": float(np.mean(cand))}
    tokens = (max(1, sum(reference.lengths)), max(1, sum(candidate.lengths)))
    shift = candidate.score_sum / tokens[1] - reference.score_sum / tokens[0]
    spread = reference.score_var / tokens[0] ** 2 + candidate.score_var / tokens[1] ** 2
    stats["logprob_per_token"] = {
        "test": "centred score z", "effect": shift,
        "p": _two_sided(shift / math.sqrt(spread)) if spread > 0 else 1.0,
        "training": float(np.mean(reference.logprob_means)),
        "serving": float(np.mean(candidate.logprob_means))}
    rates = [("truncation_rate", reference.truncated, candidate.truncated)]
    if reference.format_hits is not None and candidate.format_hits is not None:
        rates.append(("format_hit_rate", reference.format_hits, candidate.format_hits))
    for name, ref_hits, cand_hits in rates:
        diff, p = two_proportions(sum(ref_hits), len(ref_hits), sum(cand_hits), len(cand_hits))
        stats[name] = {"test": "two-proportion z", "p": p, "effect": diff,
                       "training": sum(ref_hits) / max(1, len(ref_hits)),
                       "serving": sum(cand_hits) / max(1, len(cand_hits))}
    names = list(stats)
    for name, reject in zip(names, holm([stats[k]["p"] for k in names], alpha), strict=True):
        stats[name]["rejected"] = reject
    return stats
