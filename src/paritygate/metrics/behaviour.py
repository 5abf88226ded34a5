"""Two-sample statistics for sampled behaviour (numpy only): rank test, proportions, Holm,
bootstrap interval of a difference of means, distinct-n and self-ROUGE-L diversity, and the
sample size a test needs to detect a given effect."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from paritygate.records import OMIT_NONE, Record


def _two_sided(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def mann_whitney(training: Sequence[float], serving: Sequence[float]) -> tuple[float, float]:
    """Mann–Whitney U test, normal approximation with tie correction: ``(effect, p)``, the
    effect the rank-biserial correlation ``2 U / (n m) - 1`` (positive: serving larger)."""
    x = np.asarray(training, dtype=np.float64)
    y = np.asarray(serving, dtype=np.float64)
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
    u = float(ranks[n:].sum() - m * (m + 1) / 2.0)  # U of the serving side
    mean = n * m / 2.0
    var = n * m / 12.0 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    effect = 2.0 * u / (n * m) - 1.0
    if var <= 0:
        return effect, 1.0
    z = (u - mean - math.copysign(0.5, u - mean) * (u != mean)) / math.sqrt(var)
    return effect, _two_sided(z)


def two_proportions(train_hits: int, train_n: int, serve_hits: int, serve_n: int,
                    ) -> tuple[float, float]:
    """Pooled two-proportion z test: ``(serving rate - training rate, p)``."""
    if train_n == 0 or serve_n == 0:
        return 0.0, 1.0
    p1, p2 = train_hits / train_n, serve_hits / serve_n
    pooled = (train_hits + serve_hits) / (train_n + serve_n)
    var = pooled * (1 - pooled) * (1 / train_n + 1 / serve_n)
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


def bootstrap_diff(training: Sequence[float], serving: Sequence[float], *, seed: int,
                   resamples: int = 2000, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean difference, low, high)``: the percentile bootstrap interval of
    ``mean(serving) - mean(training)``."""
    x = np.asarray(training, dtype=np.float64)
    y = np.asarray(serving, dtype=np.float64)
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


def lcs_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common subsequence of two token sequences (row-wise dynamic
    programme, vectorised over ``b``: O(len(a) * len(b)) time, O(len(b)) memory)."""
    if not a or not b:
        return 0
    y = np.asarray(b)
    row = np.zeros(len(b) + 1, dtype=np.int64)
    for token in a:
        # new[j] = old[j-1] + 1 on a match, else max(new[j-1], old[j]); the running max over
        # j of (candidate) resolves new[j-1] in one pass because candidates never decrease.
        cand = np.maximum(row[1:], np.where(y == token, row[:-1] + 1, 0))
        row[1:] = np.maximum.accumulate(cand)
    return int(row[-1])


def rouge_l(a: Sequence[int], b: Sequence[int]) -> float:
    """ROUGE-L F1 of two token sequences: ``2 LCS / (len(a) + len(b))`` (1.0 when both are
    empty)."""
    if not a and not b:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))


def self_rouge_l(samples: Sequence[Sequence[int]], pairs: int = 64) -> float:
    """Mean ROUGE-L F1 over pairs of one prompt's samples (consecutive pairs ``(i, i+1)``,
    at most ``pairs`` of them: a fixed, seed-free subset that keeps the cost linear in the
    samples). High means the samples repeat each other: low diversity."""
    count = min(pairs, len(samples) - 1)
    if count < 1:
        return 1.0
    return float(np.mean([rouge_l(samples[i], samples[i + 1]) for i in range(count)]))


STOP_REASONS = ("eos", "stop", "length")
"""How a sample ends: the EOS token, a stop string (or stop token id), the length limit."""


def samples_to_detect(effect: float, *, alpha: float, power: float = 0.9,
                      base_rate: float | None = None) -> int:
    """Samples per side a two-sided test at ``alpha`` needs to detect ``effect`` with
    probability ``power``: for a rate (``base_rate`` given) a difference of ``effect`` in a
    proportion around ``base_rate``; otherwise a shift of ``effect`` standard deviations in a
    location (the Mann–Whitney test's asymptotic efficiency 3/π against the t test folded in).
    Normal approximation; ``alpha`` is the per-test level (Holm's smallest is ``alpha / k``)."""
    from statistics import NormalDist

    if effect == 0:
        return 0
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    if base_rate is not None:
        p1 = min(max(base_rate, 1e-9), 1 - 1e-9)
        p2 = min(max(base_rate + effect, 1e-9), 1 - 1e-9)
        return math.ceil(z * z * (p1 * (1 - p1) + p2 * (1 - p2)) / (p2 - p1) ** 2)
    return math.ceil(2 * z * z / (effect * effect) / (3 / math.pi))


@dataclass(frozen=True)
class StatRow(Record):
    """One statistic's comparison: its test, p-value (or a bootstrap interval ``low``..``high``),
    effect, side values and Holm rejection."""

    test: str
    effect: float
    training: float
    serving: float
    p: float | None = field(default=None, metadata=OMIT_NONE)
    low: float | None = field(default=None, metadata=OMIT_NONE)
    high: float | None = field(default=None, metadata=OMIT_NONE)
    rejected: bool | None = field(default=None, metadata=OMIT_NONE)
    """Holm's verdict over the tests with a p-value (none for the reward's interval)."""


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
    stop_reasons: list[str] | None = None
    """Per sample, one of :data:`STOP_REASONS` (``other`` when none applies)."""
    rouge_l: list[float] | None = None
    """Self-ROUGE-L of each prompt's samples."""
    repeats: int = 0
    """Sampled tokens already in their sequence (prompt or earlier completion tokens)."""
    repeat_sum: float | None = None
    """Sum over every token of ``1[repeat] - P_train(repeat)``: mean 0 under the trainer."""
    repeat_var: float = 0.0
    """Sum over every token of ``P(repeat) (1 - P(repeat))``: the variance of that sum."""
    prompt_scores: dict[tuple[int, ...], tuple[float, float, int]] | None = None
    """Per prompt (as the trainer sees it): the log-prob score's sum, variance and token count."""


def _worst_prompt(training: SideSample, serving: SideSample) -> StatRow | None:
    """The log-prob score compared prompt by prompt: the largest |z| over the prompts both
    sides sampled, Bonferroni-corrected over them. A difference confined to a few prompts (a
    chat template that changes only chat prompts) is diluted in the pooled score; not here."""
    train, serve = training.prompt_scores, serving.prompt_scores
    if train is None or serve is None:
        return None
    worst: tuple[float, float] = (0.0, 0.0)  # (|z|, shift)
    common = [k for k in train if k in serve and train[k][2] and serve[k][2]]
    for key in common:
        (rs, rv, rn), (cs, cv, cn) = train[key], serve[key]
        shift = cs / cn - rs / rn
        spread = rv / rn**2 + cv / cn**2
        z = abs(shift) / math.sqrt(spread) if spread > 0 else 0.0
        worst = max(worst, (z, shift))
    p = min(1.0, len(common) * _two_sided(worst[0])) if common else 1.0
    return StatRow("centred score z per prompt, Bonferroni", worst[1], float(len(common)),
                   float(len(common)), p=p)


def compare(training: SideSample, serving: SideSample, alpha: float) -> dict[str, StatRow]:
    """Each statistic's test, p-value, effect, side values and Holm rejection at ``alpha``."""
    stats: dict[str, StatRow] = {}
    ranked: list[tuple[str, Sequence[float], Sequence[float]]] = [
              ("length", training.lengths, serving.lengths),
              ("distinct_2", training.diversity, serving.diversity)]
    if training.rouge_l is not None and serving.rouge_l is not None:
        ranked.append(("self_rouge_l", training.rouge_l, serving.rouge_l))
    for name, train, serve in ranked:
        effect, p = mann_whitney(train, serve)
        stats[name] = StatRow("Mann-Whitney", effect, float(np.mean(train)),
                              float(np.mean(serve)), p=p)
    tokens = (max(1, sum(training.lengths)), max(1, sum(serving.lengths)))
    shift = serving.score_sum / tokens[1] - training.score_sum / tokens[0]
    spread = training.score_var / tokens[0] ** 2 + serving.score_var / tokens[1] ** 2
    stats["logprob_per_token"] = StatRow(
        "centred score z", shift, float(np.mean(training.logprob_means)),
        float(np.mean(serving.logprob_means)),
        p=_two_sided(shift / math.sqrt(spread)) if spread > 0 else 1.0)
    if training.repeat_sum is not None and serving.repeat_sum is not None:
        # Like the log-prob score: a repeat's probability under the trainer is known exactly,
        # so a repetition penalty (or its absence) moves this far beyond its noise.
        shift = serving.repeat_sum / tokens[1] - training.repeat_sum / tokens[0]
        spread = training.repeat_var / tokens[0] ** 2 + serving.repeat_var / tokens[1] ** 2
        stats["repeat_rate"] = StatRow(
            "centred repeat z", shift, training.repeats / tokens[0],
            serving.repeats / tokens[1],
            p=_two_sided(shift / math.sqrt(spread)) if spread > 0 else 1.0)
    per_prompt = _worst_prompt(training, serving)
    if per_prompt is not None:
        stats["logprob_per_prompt"] = per_prompt
    rates: list[tuple[str, list[bool], list[bool]]] = [
        ("truncation_rate", training.truncated, serving.truncated)]
    if training.stop_reasons is not None and serving.stop_reasons is not None:
        for reason, name in (("eos", "eos_rate"), ("stop", "stop_string_rate")):
            rates.append((name, [r == reason for r in training.stop_reasons],
                          [r == reason for r in serving.stop_reasons]))
    if training.format_hits is not None and serving.format_hits is not None:
        rates.append(("format_hit_rate", training.format_hits, serving.format_hits))
    for name, train_hits, serve_hits in rates:
        diff, p = two_proportions(sum(train_hits), len(train_hits),
                                  sum(serve_hits), len(serve_hits))
        stats[name] = StatRow("two-proportion z", diff,
                              sum(train_hits) / max(1, len(train_hits)),
                              sum(serve_hits) / max(1, len(serve_hits)), p=p)
    names = list(stats)
    p_values = [1.0 if stats[k].p is None else float(stats[k].p or 0.0) for k in names]
    for name, reject in zip(names, holm(p_values, alpha), strict=True):
        stats[name] = dataclasses.replace(stats[name], rejected=reject)
    return stats
