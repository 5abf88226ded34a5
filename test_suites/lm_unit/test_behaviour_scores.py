"""behaviour_parity's per-sample trainer scores against a direct computation: the centred
log-prob score and the repeat score (``1[repeat] - P(repeat)`` with the prompt's and earlier
completion tokens as the repeats)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paritygate.engines.dump_stream import Draw
from paritygate.families.causal_lm.behaviour_sides import SideReducer


def test_scores_match_the_definition() -> None:
    rng = np.random.default_rng(0)
    none: Any = None
    for _ in range(50):
        vocab = int(rng.integers(4, 12))
        prompt = tuple(rng.integers(0, vocab, rng.integers(1, 5)).tolist())
        out = rng.integers(0, vocab, rng.integers(1, 10)).tolist()
        logits = rng.normal(0, 2, (len(out) + 1, vocab)).astype(np.float32)
        reducer = SideReducer(none, none, none, 8)
        reducer._score(Draw(prompt, out, "eos"), logits)
        p = np.exp(logits[: len(out)].astype(np.float64))
        p /= p.sum(-1, keepdims=True)
        logp = np.log(p)
        entropy = -(p * logp).sum(-1)
        score = sum(logp[j, t] + entropy[j] for j, t in enumerate(out))
        repeat = var = 0.0
        hits = 0
        for j, t in enumerate(out):
            seen = set(prompt) | set(out[:j])
            q = sum(p[j, s] for s in seen)
            hits += t in seen
            repeat += (t in seen) - q
            var += q * (1 - q)
        assert np.isclose(reducer.score[0], score)
        assert np.isclose(reducer.score[2], repeat) and np.isclose(reducer.score[3], var)
        assert reducer.repeats == hits
        assert reducer.prompts[prompt][2] == len(out)
