"""behaviour_parity: sampled with each side's own config, the two sides behave alike.

Each side's samples come from an engine or a dump. The trainer's sampler is HF ``generate`` on
the training model with the training sampling config, or ``causal_lm.behaviour.training_dump``;
the serving side is an endpoint or vLLM where ``engines`` names it (one seeded request per
sample, so the draw reproduces from the seed; an endpoint under ``sampling: server`` samples
with the server's own defaults), else HF ``generate`` on the served model, or ``serving_dump``.
Dumps (a file, a glob or a list of shards a distributed engine wrote) are read in streaming
batches: O(batch) memory. Engines draw ``causal_lm.behaviour.samples`` completions per probe
from independent seeds (a function of the gate's ``seed``). Compared, each with a two-sample
test and an effect size: completion length (Mann–Whitney), the stop-reason rates (EOS, stop
string, length limit: two-proportion z), distinct-2 and self-ROUGE-L per prompt
(Mann–Whitney), the training model's mean log-prob per token and repeat rate (centred scores
with exact mean 0 and known variance under the trainer's distribution: the most sensitive
statistics for a sampling drift and a repetition penalty) and, with ``format_regex``, the
format hit rate. The family-wise false-alarm rate is ``alpha`` (Holm's correction). With
``reward_fn``, E[reward] is compared by a bootstrap interval of the difference: it fails when
the whole interval lies beyond ``reward_tolerance`` (0.05 by default: a difference above 0.05
means roll back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.check import CheckSpec, Thresholds
from paritygate.metrics.behaviour import StatRow
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.behaviour_sides import (
        BehaviourSetup,
        Reward,
        SideReducer,
    )
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.sections.behaviour_parity import BehaviourSpec

# Any rejected test or reward beyond tolerance is a behaviour difference: alpha sets the rate.
DEFAULTS: dict[str, float] = {"rejected_tests": 0.0}

KIND_OF = {"length": "length_differs", "truncation_rate": "truncation_differs",
           "eos_rate": "stop_reason_differs", "stop_string_rate": "stop_reason_differs",
           "distinct_2": "diversity_differs", "self_rouge_l": "diversity_differs",
           "logprob_per_token": "logprob_differs", "logprob_per_prompt": "logprob_differs",
           "repeat_rate": "repetition_differs",
           "format_hit_rate": "format_differs"}
KINDS = tuple(dict.fromkeys([*KIND_OF.values(), "reward_differs"]))
SIDES = ("training", "serving")


@dataclass(frozen=True)
class BehaviourRecord(Record):
    """Each statistic's test and outcome, the design (samples per prompt, alpha, where each
    side's samples came from), per side the samples, stop reasons and completion-length
    histogram, and the samples per side that would detect a given effect."""

    statistics: dict[str, StatRow]
    samples_per_prompt: int
    alpha: float
    sources: dict[str, str]
    samples: dict[str, int]
    stop_reasons: dict[str, dict[str, int]]
    length_histogram: dict[str, dict[str, int]]
    samples_to_detect: dict[str, int]


def _reduce(setup: BehaviourSetup, reward: Reward | None,
            kept: set[int]) -> tuple[dict[str, SideReducer], dict[str, str]]:
    """Each side's samples (its dump, else its sampler's draws) reduced as they stream in."""
    from paritygate.errors import InputError

    reducers: dict[str, SideReducer] = {}
    origins: dict[str, str] = {}
    for source in setup.sources:
        reducer = setup.reducer(source, reward)
        batches, origins[source.side.name] = setup.draws(source, kept)
        for batch in batches:
            reducer.add(batch)
        if len(reducer.lengths) < setup.spec.samples:
            raise InputError(setup.config_path, source.key,
                             f"{len(reducer.lengths)} samples; the tests need at least "
                             f"{setup.spec.samples} per side (causal_lm.behaviour.samples)")
        reducers[source.side.name] = reducer
    return reducers, origins


def _guidance(stats: dict[str, StatRow], alpha: float, tests: int) -> dict[str, int]:
    """Samples per side that would detect, with 90% power at Holm's strictest level, a shift of
    0.2 standard deviations in length and a 0.05 change in each rate."""
    from paritygate.metrics.behaviour import samples_to_detect

    level = alpha / max(1, tests)
    out = {"length shift 0.2 sd": samples_to_detect(0.2, alpha=level)}
    for name in ("truncation_rate", "eos_rate", "stop_string_rate", "format_hit_rate"):
        if name in stats:
            base = float(stats[name].training)
            out[f"{name} +0.05"] = samples_to_detect(0.05 if base < 0.95 else -0.05,
                                                     alpha=level, base_rate=base)
    return out


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.metrics.behaviour import compare

    m = Measurement("behaviour_parity")
    setup = ctx.behaviour
    if setup is None:
        return m.skip("no causal_lm.behaviour section: sampled behaviour is not compared")
    spec = setup.spec
    dumps = spec.training_dump is not None and spec.serving_dump is not None
    if not dumps and not setup.can_sample:
        return m.skip("behaviour_parity samples with the HF or vLLM engine or an endpoint "
                      "(engines: [hf], [vllm] or [endpoint]) or reads "
                      "causal_lm.behaviour.training_dump and serving_dump")
    kept = setup.kept()
    probes = setup.scorer.probes
    if not kept and not dumps:
        return m.skip("no probe has tokens on both sides: nothing to sample")
    if len(kept) < len(probes) and not dumps:
        m.note("probes with no tokens on one side left out: " + ", ".join(
            p.id for i, p in enumerate(probes) if i not in kept))
    reward = setup.reward()
    reducers, origins = _reduce(setup, reward, kept)
    stats = compare(reducers["training"].finish(), reducers["serving"].finish(), spec.alpha)
    configs = _configs(setup, origins)
    failed = 0
    for name, row in stats.items():
        m.metric(f"{name}_p", row.p, bad="none", ratchet=False)
        m.metric(f"{name}_effect", row.effect, bad="none", ratchet=False)
        if row.rejected:
            failed += 1
            m.fail(KIND_OF[name],
                   f"{name.replace('_', ' ')} differs: training {row.training:.4g} vs serving "
                   f"{row.serving:.4g} ({row.test}, p = {row.p:.2g}, effect "
                   f"{row.effect:+.3g}; Holm at alpha {spec.alpha:g} over {len(stats)} "
                   f"tests, {spec.samples} samples per prompt per side) {configs}")
    tests = len(stats)
    if reward is not None:
        failed += _reward(spec, setup.seed, m, stats, reducers, configs)
    m.metric("rejected_tests", failed, threshold=thresholds["rejected_tests"], key=True)
    m.record(BehaviourRecord(
        statistics=stats, samples_per_prompt=spec.samples, alpha=spec.alpha, sources=origins,
        samples={s: len(r.lengths) for s, r in reducers.items()},
        stop_reasons={s: {k: r.finishes.count(k) for k in sorted(set(r.finishes))}
                      for s, r in reducers.items()},
        length_histogram={s: {str(k): int(v) for k, v in zip(*np.unique(
            r.lengths, return_counts=True), strict=True)} for s, r in reducers.items()},
        samples_to_detect=_guidance(stats, spec.alpha, tests)))
    return m


def _configs(setup: BehaviourSetup, origins: dict[str, str]) -> str:
    train, serve = (source.side.sampling.spec() for source in setup.sources)
    return (f"(training {origins['training']}: temperature {train.temperature}, top_p "
            f"{train.top_p}, max_new_tokens {train.max_new_tokens}, stop {train.stop}, "
            f"repetition_penalty {train.repetition_penalty}; serving {origins['serving']}: "
            f"temperature {serve.temperature}, top_p {serve.top_p}, max_new_tokens "
            f"{serve.max_new_tokens}, stop {serve.stop}, repetition_penalty "
            f"{serve.repetition_penalty})")


def _reward(spec: BehaviourSpec, seed: int, m: Measurement, stats: dict[str, StatRow],
            reducers: dict[str, SideReducer], configs: str) -> int:
    """E[reward] by a bootstrap interval of the difference against the tolerance."""
    from paritygate.metrics.behaviour import bootstrap_diff

    rewards = {s: reducers[s].rewards for s in SIDES}
    diff, low, high = bootstrap_diff(rewards["training"], rewards["serving"],
                                     seed=seed)
    tol = spec.reward_tolerance
    row = StatRow("bootstrap 95%", diff, float(np.mean(rewards["training"])),
                  float(np.mean(rewards["serving"])), low=low, high=high)
    stats["reward"] = row
    m.metric("reward_diff", diff, bad="none", ratchet=False)
    if not (low > tol or high < -tol):
        return 0
    m.fail("reward_differs",
           f"E[reward] differs: training {row.training:.4g} vs serving {row.serving:.4g}, "
           f"difference {diff:+.3g} with 95% bootstrap interval [{low:+.3g}, {high:+.3g}] beyond "
           f"the tolerance {tol:g} (causal_lm.behaviour.reward_tolerance; 0.05 is the offline "
           f"equivalence check's roll-back figure) {configs}")
    return 1


CHECK = CheckSpec(
    id="behaviour_parity",
    summary="sampled with each side's config, the trainer's sampler and the engine behave alike",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("slow",),
    kinds=KINDS,
)

POSITION = 170
"""The check's place in the checklist (and in every report): the registry sorts by it."""
