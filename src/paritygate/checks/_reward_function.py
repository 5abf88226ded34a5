"""A reward function against the trained reward model's own scores, for ``reward_parity``.

With both ``causal_lm.reward.function`` and a reward model, the function is taken to serve
that model's reward (a custom scorer at serving) unless ``function_matches_model: false``
declares it another reward: on the same samples its rewards must be the trained model's scores
under training's layout. A function that moves scores is named with how far and how many pair
rankings it flips; one that is the model's scores up to a positive affine map (a rescaled or
shifted reward) is named with the map."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from paritygate.records import OMIT_NONE, Record

if TYPE_CHECKING:
    from paritygate.families.causal_lm.reward import RewardSetup
    from paritygate.result import Measurement

AFFINE_RTOL = 1e-3
"""Residual of the least-squares fit f = a m + b, relative to the spread of f, under which a
function is the model's scores rescaled (float32 scoring noise leaves ~1e-6)."""


@dataclass(frozen=True)
class FunctionVsModel(Record):
    """The reward function's scores against the reward model's: pairs ordered and flipped,
    and the affine fit when it rescales them."""

    pairs_ordered: int
    pairs_flipped: int
    samples: int
    scale: float | None = field(default=None, metadata=OMIT_NONE)
    shift: float | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class FunctionRecord(Record):
    function_vs_model: FunctionVsModel


def pairs_flipped(model: list[float], function: list[float], tol: float) -> tuple[int, int]:
    """Pairs of samples the model orders (scores more than ``tol`` apart) and how many of
    them the function orders the other way (or ties)."""
    ordered = flipped = 0
    for i in range(len(model)):
        for j in range(i + 1, len(model)):
            gap = model[i] - model[j]
            if abs(gap) <= tol:
                continue
            ordered += 1
            flipped += (function[i] - function[j]) * gap <= 0
    return ordered, flipped


def affine_fit(model: list[float], function: list[float]) -> tuple[float, float, float]:
    """Least-squares ``function = a * model + b``: ``(a, b, residual / spread of function)``."""
    n = len(model)
    mean_m, mean_f = sum(model) / n, sum(function) / n
    var = sum((x - mean_m) ** 2 for x in model)
    cov = sum((x - mean_m) * (y - mean_f) for x, y in zip(model, function, strict=True))
    a = cov / var if var else 0.0
    b = mean_f - a * mean_m
    left = sum((y - a * x - b) ** 2 for x, y in zip(model, function, strict=True)) ** 0.5
    spread = sum((y - mean_f) ** 2 for y in function) ** 0.5
    return a, b, left / spread if spread else float("inf")


def compare_with_model(m: Measurement, setup: RewardSetup, rewards: list[float],
                       limit: float) -> None:
    """``rewards`` (the function's, batched, on ``setup.samples``) against the trained reward
    model's scores on the same samples under training's layout."""
    assert setup.training is not None
    layout = setup.training
    enc = setup.encode(layout)
    scores = setup.score(setup.trained, enc.seqs, layout.padding_side, layout.batch_size).scores
    diffs = [abs(f - s) for f, s in zip(rewards, scores, strict=True)]
    ordered, flipped = pairs_flipped(scores, rewards, limit)
    share = flipped / ordered if ordered else 0.0
    m.metric("function_score_max_abs", max(diffs), threshold=limit, ratchet=False)
    m.metric("function_score_mean_abs", sum(diffs) / len(diffs), bad="none", ratchet=False)
    m.metric("function_pairs_flipped", share, bad="none", ratchet=False)
    compared = FunctionVsModel(ordered, flipped, len(diffs))
    m.record(FunctionRecord(compared))
    if max(diffs) <= limit:
        return
    name = setup.function_name
    other = ("; set causal_lm.reward.function_matches_model: false if it is another reward "
             "by design")
    a, b, residual = affine_fit(scores, rewards)
    if flipped == 0 and a > 0 and residual <= AFFINE_RTOL:
        m.fail("function_rescaled",
               f"{name} returns the trained reward model's scores rescaled: {a:.4g} x score "
               f"{b:+.4g} on {len(diffs)} samples (moved up to {max(diffs):.3g}, no pair "
               f"ranking flipped): the reward's scale against the KL term differs from "
               f"training's{other}", metric="function_score_max_abs")
        m.record(FunctionRecord(replace(compared, scale=a, shift=b)))
        return
    m.fail("function_scores_differ",
           f"{name} scores the samples otherwise than the trained reward model: scores moved "
           f"by up to {max(diffs):.3g} (mean {sum(diffs) / len(diffs):.3g}) and "
           f"{flipped} of {ordered} pair rankings flipped ({share:.0%}){other}",
           metric="function_score_max_abs")
