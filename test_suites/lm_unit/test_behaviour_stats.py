"""behaviour_parity's tests on a cheap exact sampler (a Markov chain over 12 tokens, token 0
ends a sample): the clean twin's false-alarm rate over 100 seeds, and each sampling fault
detected at the default sample size. The log-probs, entropies and varentropies are exact."""

from __future__ import annotations

import numpy as np
import pytest

from paritygate.families.causal_lm.config import BehaviourSpec
from paritygate.metrics.behaviour import SideSample, compare, distinct_n, holm, mann_whitney

VOCAB, PROMPTS, MAX_NEW = 12, 7, 16
N = BehaviourSpec().samples
ALPHA = BehaviourSpec().alpha
LOGITS = np.random.default_rng(0).normal(0.0, 2.0, (VOCAB, VOCAB))  # next-token logits per token


def _dist(row: np.ndarray, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    z = row / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return p


def _side(seed: int, temperature: float = 1.0, top_p: float = 1.0,
          max_new: int = MAX_NEW) -> SideSample:
    rng = np.random.default_rng(seed)
    train = [_dist(LOGITS[t]) for t in range(VOCAB)]  # the trainer's distribution (T = 1)
    lengths, truncated, means, samples = [], [], [], []
    total = variance = 0.0
    for prompt in range(1, PROMPTS + 1):
        for _ in range(N):
            state, out, logps = prompt, [], []
            while len(out) < max_new:
                token = int(rng.choice(VOCAB, p=_dist(LOGITS[state], temperature, top_p)))
                p = train[state]
                logp = np.log(p)
                entropy = -(p * logp).sum()
                logps.append(logp[token])
                total += logp[token] + entropy
                variance += (p * logp * logp).sum() - entropy**2
                out.append(token)
                state = token
                if token == 0:
                    break
            lengths.append(len(out))
            truncated.append(out[-1] != 0)
            means.append(float(np.mean(logps)))
            samples.append(out)
    diversity = [distinct_n(samples[i : i + N]) for i in range(0, len(samples), N)]
    return SideSample(lengths, truncated, diversity, means, total, variance)


def _rejected(serving: SideSample, training: SideSample) -> list[str]:
    return [k for k, v in compare(training, serving, ALPHA).items() if v["rejected"]]


def test_clean_twin_false_alarms_at_most_1_in_100_seeds() -> None:
    alarms = [seed for seed in range(100)
              if _rejected(_side(2 * seed + 1), _side(2 * seed + 2))]
    assert len(alarms) <= 1, alarms


@pytest.mark.parametrize(("fault", "kwargs", "statistic"), [
    ("temperature 0.8 vs 1.0", {"temperature": 0.8}, "logprob_per_token"),
    ("top_p 0.9 vs 1.0", {"top_p": 0.9}, "logprob_per_token"),
    ("max_new_tokens halved", {"max_new": MAX_NEW // 2}, "truncation_rate"),
])
def test_each_fault_detected_at_the_default_size(fault: str, kwargs: dict, statistic: str) -> None:
    detected = [seed for seed in range(10)
                if statistic in _rejected(_side(2 * seed + 1, **kwargs), _side(2 * seed + 2))]
    assert len(detected) == 10, (fault, detected)


def test_mann_whitney_and_holm() -> None:
    effect, p = mann_whitney([1, 2, 3, 4, 5] * 10, [6, 7, 8, 9, 10] * 10)
    assert effect == 1.0 and p < 1e-10
    assert mann_whitney([1, 2, 3], [1, 2, 3]) == (0.0, 1.0)
    assert holm([0.001, 0.04, 0.03], 0.05) == [True, False, False]
    assert holm([0.001, 0.02, 0.03], 0.05) == [True, True, True]
