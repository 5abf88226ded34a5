"""behaviour_parity's tests on a cheap exact sampler (a Markov chain over 12 tokens, token 0
is EOS, token 1 the stop string): the clean twin's false-alarm rate over 100 seeds with every
statistic (length, stop-reason rates, distinct-2, self-ROUGE-L, log-prob per token), and each
sampling fault detected at the default sample size. The log-probs, entropies and varentropies
are exact."""

from __future__ import annotations

import numpy as np
import pytest

from paritygate.metrics.behaviour import (
    SideSample,
    compare,
    distinct_n,
    holm,
    lcs_length,
    mann_whitney,
    rouge_l,
    samples_to_detect,
    self_rouge_l,
    two_proportions,
)
from paritygate.sections.behaviour_parity import BehaviourSpec

VOCAB, PROMPTS, MAX_NEW = 12, 7, 16
N = BehaviourSpec().samples
ALPHA = BehaviourSpec().alpha
LOGITS = np.random.default_rng(0).normal(0.0, 2.0, (VOCAB, VOCAB))  # next-token logits per token


def _dist(row: np.ndarray, temperature: float = 1.0, top_p: float = 1.0,
          seen: set[int] | None = None, penalty: float = 1.0) -> np.ndarray:
    row = row.copy()
    for t in seen if penalty != 1.0 and seen else ():  # HF's repetition penalty
        row[t] = row[t] / penalty if row[t] > 0 else row[t] * penalty
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
          max_new: int = MAX_NEW, stop: bool = True, penalty: float = 1.0,
          shifted_prompt: int = 0) -> SideSample:
    """One side's samples; ``shifted_prompt``: that prompt is sampled from the state after
    another prompt (as a chat template that renders one prompt otherwise), scored after its
    own."""
    rng = np.random.default_rng(seed)
    train = [_dist(LOGITS[t]) for t in range(VOCAB)]  # the trainer's distribution (T = 1)
    lengths, truncated, means, samples, reasons = [], [], [], [], []
    total = variance = repeat_sum = repeat_var = 0.0
    repeats = 0
    per_prompt: dict[tuple[int, ...], tuple[float, float, int]] = {}
    for prompt in range(1, PROMPTS + 1):
        before = (total, variance, sum(lengths))
        for _ in range(N):
            state, out, logps = prompt, [], []
            while len(out) < max_new:
                drawn = PROMPTS + 1 if not out and prompt == shifted_prompt else state
                token = int(rng.choice(VOCAB, p=_dist(LOGITS[drawn], temperature, top_p,
                                                      set(out), penalty)))
                p = train[state]
                logp = np.log(p)
                entropy = -(p * logp).sum()
                logps.append(logp[token])
                total += logp[token] + entropy
                variance += (p * logp * logp).sum() - entropy**2
                q = float(p[sorted(set(out))].sum()) if out else 0.0  # P(a repeat)
                repeats += token in out
                repeat_sum += (token in out) - q
                repeat_var += q * (1 - q)
                out.append(token)
                state = token
                if token == 0 or (stop and token == 1):
                    break
            lengths.append(len(out))
            reason = {0: "eos", 1: "stop" if stop else "length"}.get(out[-1], "length")
            reason = reason if len(out) == max_new or out[-1] in (0, 1) else "other"
            reasons.append(reason)
            truncated.append(reason == "length")
            means.append(float(np.mean(logps)))
            samples.append(out)
        per_prompt[(prompt,)] = (total - before[0], variance - before[1],
                                 sum(lengths) - before[2])
    diversity = [distinct_n(samples[i : i + N]) for i in range(0, len(samples), N)]
    rouge = [self_rouge_l(samples[i : i + N]) for i in range(0, len(samples), N)]
    return SideSample(lengths, truncated, diversity, means, total, variance,
                      stop_reasons=reasons, rouge_l=rouge, repeats=repeats,
                      repeat_sum=repeat_sum, repeat_var=repeat_var, prompt_scores=per_prompt)


def _rejected(serving: SideSample, training: SideSample) -> list[str]:
    return [k for k, v in compare(training, serving, ALPHA).items() if v.rejected]


def test_clean_twin_false_alarms_at_most_1_in_100_seeds() -> None:
    alarms = [seed for seed in range(100)
              if _rejected(_side(2 * seed + 1), _side(2 * seed + 2))]
    assert len(alarms) <= 1, alarms


@pytest.mark.parametrize(("fault", "kwargs", "statistic"), [
    ("temperature 0.8 vs 1.0", {"temperature": 0.8}, "logprob_per_token"),
    ("top_p 0.9 vs 1.0", {"top_p": 0.9}, "logprob_per_token"),
    ("max_new_tokens halved", {"max_new": MAX_NEW // 2}, "truncation_rate"),
    ("stop string missing on one side", {"stop": False}, "stop_string_rate"),
    ("repetition_penalty 1.3 on one side", {"penalty": 1.3}, "repeat_rate"),
    ("one prompt rendered otherwise", {"shifted_prompt": 6}, "logprob_per_prompt"),
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


def test_lcs_and_rouge_l_against_the_textbook_recursion() -> None:
    def slow(a: list[int], b: list[int]) -> int:
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i, x in enumerate(a):
            for j, y in enumerate(b):
                table[i + 1][j + 1] = (table[i][j] + 1 if x == y
                                       else max(table[i][j + 1], table[i + 1][j]))
        return table[-1][-1]

    rng = np.random.default_rng(3)
    for _ in range(200):
        a = rng.integers(0, 4, rng.integers(0, 12)).tolist()
        b = rng.integers(0, 4, rng.integers(0, 12)).tolist()
        assert lcs_length(a, b) == slow(a, b), (a, b)
    assert rouge_l([1, 2, 3], [1, 2, 3]) == 1.0 and rouge_l([1, 2], [3, 4]) == 0.0
    assert self_rouge_l([[1, 2, 3], [1, 2, 3], [1, 2, 3]]) == 1.0
    assert self_rouge_l([[1, 2], [3, 4]]) == 0.0


@pytest.mark.parametrize("reason", ["eos", "stop", "length"])
def test_each_stop_reason_rate_is_tested(reason: str) -> None:
    """One side ends by ``reason`` in 60% of samples, the other in 30%: that rate's test, and
    only a rate test, rejects."""
    others = [r for r in ("eos", "stop", "length") if r != reason]
    ref = [reason] * 30 + [others[0]] * 35 + [others[1]] * 35
    cand = [reason] * 60 + [others[0]] * 20 + [others[1]] * 20
    name = {"eos": "eos_rate", "stop": "stop_string_rate", "length": "truncation_rate"}[reason]

    def side(reasons: list[str]) -> SideSample:
        return SideSample([5] * 100, [r == "length" for r in reasons], [0.5] * 10,
                          [-1.0] * 100, 0.0, 100.0, stop_reasons=reasons, rouge_l=[0.3] * 10)

    stats = compare(side(ref), side(cand), ALPHA)
    assert stats[name].rejected and abs(stats[name].effect - 0.3) < 1e-12
    assert stats[name].training == 0.3 and stats[name].serving == 0.6


def test_sample_size_guidance_matches_the_simulated_power() -> None:
    """The rate test's sample size for a 0.1 rise from 0.2 detects it about 90% of the time."""
    n = samples_to_detect(0.1, alpha=ALPHA, base_rate=0.2)
    assert 400 < n < 800
    rng = np.random.default_rng(0)
    hits = sum(two_proportions(int(rng.binomial(n, 0.2)), n, int(rng.binomial(n, 0.3)), n)[1]
               < ALPHA for _ in range(400))
    assert 0.84 < hits / 400 < 0.96, hits
    assert samples_to_detect(0.5, alpha=ALPHA) < samples_to_detect(0.25, alpha=ALPHA)
