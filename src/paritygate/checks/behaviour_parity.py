"""behaviour_parity: sampled with each side's own config, the two sides behave alike.

The trainer's sampler (HF ``generate`` on the training model with the training sampling config
and tokenizer) and the serving engine (HF ``generate`` on the served model with the serving
config) each draw ``causal_lm.behaviour.samples`` completions per probe, from independent
seeds. Compared, each with a two-sample test and an effect size: completion length
(Mann–Whitney), truncation rate (length limit hit, two-proportion z), distinct-2 diversity per
prompt (Mann–Whitney), the training model's mean raw log-prob per token of each sample
(tested through the centred score ``log p + H``: exact mean 0 and known variance under the
trainer's distribution, the most sensitive single statistic for a sampling drift) and, with
``format_regex``, the format hit rate (two-proportion z). The tests' family-wise false-alarm
rate is ``alpha`` (Holm's correction). With ``reward_fn``, E[reward] is compared by a
bootstrap interval of the difference: it fails when the whole interval lies beyond
``reward_tolerance`` (0.05 by default: a difference above 0.05 means roll back).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.check import CheckSpec, Thresholds
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.generation import Generation, SamplingSpec
    from paritygate.families.causal_lm.context import LMContext

# Any rejected test or reward beyond tolerance is a behaviour difference: alpha sets the rate.
DEFAULTS: dict[str, float] = {"rejected_tests": 0.0}

KINDS = ("length_differs", "truncation_differs", "diversity_differs", "logprob_differs",
         "format_differs", "reward_differs")

_SERVING_SEED_OFFSET = 1_000_003  # independent draws for the two sides


def _sample(ctx: LMContext, side: str) -> tuple[Generation, SamplingSpec]:
    from paritygate.engines.generation import SamplingSpec
    from paritygate.engines.hf_generate import HFGenerateEngine

    spec = ctx.spec.behaviour
    assert spec is not None
    sampling_file = ctx.training_sampling if side == "training" else ctx.serving_sampling
    sampling = sampling_file.spec()
    seed = (sampling.seed if sampling.seed is not None else ctx.config.seed) + (
        _SERVING_SEED_OFFSET if side == "serving" else 0)
    sampling = SamplingSpec(**{**sampling.as_dict(), "seed": seed})
    kept = _kept(ctx)
    prompts = [p for i, p in enumerate(ctx.prompts(side)) if i in kept
               for _ in range(spec.samples)]
    if side == "serving":
        engine: Any = ctx.engine("hf")
    else:
        engine = HFGenerateEngine.for_tokenizer(
            ctx.reference_model(), ctx.training_tokenizer, logprobs_mode="raw",
            top_logprobs=0, batch_size=ctx.spec.engine.batch_size)
    return engine.generate(prompts, sampling), sampling


def _kept(ctx: LMContext) -> set[int]:
    """Probes with tokens on both sides (an empty side is tokenizer_parity's finding)."""
    pairs = zip(ctx.prompts("training"), ctx.prompts("serving"), strict=True)
    return {i for i, (train, serve) in enumerate(pairs) if train and serve}


def _stop_reasons(gen: Generation, sampling: SamplingSpec, tok: Any) -> list[str]:
    eos = set(sampling.eos_token_ids) or ({tok.eos_token_id} if tok.eos_token_id is not None
                                          else set())
    reasons = []
    for out in gen.output_ids:
        if out and out[-1] in eos:
            reasons.append("eos")
        elif sampling.stop and any(s in tok.decode(out) for s in sampling.stop):
            reasons.append("stop")
        else:
            reasons.append("length" if len(out) >= sampling.max_new_tokens else "other")
    return reasons


def _token_scores(ctx: LMContext, gen: Generation) -> tuple[list[float], float, float]:
    """Per sample, the training model's mean raw log-prob per token; and over every token the
    centred score ``log p(token) + H(p)`` summed, with its variance (the varentropy
    ``Var_p[log p]`` summed). Sampled from the training model's own distribution, each score
    has mean exactly 0 and that variance: a sampler that is sharper (lower temperature,
    top-p) or flatter moves it by far more than its noise. One batched forward per side."""
    import torch

    means = []
    total = variance = 0.0
    for rows, out in zip(ctx.teacher_forced(gen), gen.output_ids, strict=True):
        if not out:
            means.append(0.0)
            continue
        logp = torch.log_softmax(torch.as_tensor(np.asarray(rows[: len(out)])).double(), dim=-1)
        chosen = logp.gather(-1, torch.tensor(out).unsqueeze(-1)).squeeze(-1)  # (N,)
        probs = logp.exp()
        entropy = -(probs * logp).sum(-1)  # (N,)
        second = (probs * logp * logp).sum(-1) - entropy**2  # varentropy (N,)
        means.append(float(chosen.mean()))
        total += float((chosen + entropy).sum())
        variance += float(second.clamp(min=0).sum())
    return means, total, variance


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.metrics.behaviour import SideSample, bootstrap_diff, compare, distinct_n

    m = Measurement("behaviour_parity")
    spec = ctx.spec.behaviour
    if spec is None:
        return m.skip("no causal_lm.behaviour section: sampled behaviour is not compared")
    if "hf" not in ctx.spec.engines:
        return m.skip("behaviour_parity samples with the HF engine (engines: [hf])")
    kept = _kept(ctx)
    if not kept:
        return m.skip("no probe has tokens on both sides: nothing to sample")
    if len(kept) < len(ctx.probes):
        m.note("probes with no tokens on one side left out: " + ", ".join(
            p.id for i, p in enumerate(ctx.probes) if i not in kept))
    sides = {side: _sample(ctx, side) for side in ("training", "serving")}
    toks = {"training": ctx.training_tokenizer, "serving": ctx.serving_tokenizer}
    n = spec.samples
    texts = {s: [toks[s].decode(o, skip_special_tokens=True) for o in g.output_ids]
             for s, (g, _) in sides.items()}
    pattern = re.compile(spec.format_regex) if spec.format_regex else None
    stops: dict[str, list[str]] = {}
    reduced: dict[str, SideSample] = {}
    for s, (g, sp) in sides.items():
        stops[s] = _stop_reasons(g, sp, toks[s])
        means, total, variance = _token_scores(ctx, g)
        reduced[s] = SideSample(
            lengths=[len(o) for o in g.output_ids],
            truncated=[r == "length" for r in stops[s]],
            diversity=[distinct_n(g.output_ids[i : i + n])
                       for i in range(0, len(g.output_ids), n)],
            logprob_means=means, score_sum=total, score_var=variance,
            format_hits=[bool(pattern.search(t)) for t in texts[s]] if pattern else None)
    stats = compare(reduced["training"], reduced["serving"], spec.alpha)
    names = list(stats)
    kind_of = {"length": "length_differs", "truncation_rate": "truncation_differs",
               "distinct_2": "diversity_differs", "logprob_per_token": "logprob_differs",
               "format_hit_rate": "format_differs"}
    configs = (f"(training temperature {sides['training'][1].temperature}, top_p "
               f"{sides['training'][1].top_p}, max_new_tokens {sides['training'][1].max_new_tokens}"
               f"; serving {sides['serving'][1].temperature}, {sides['serving'][1].top_p}, "
               f"{sides['serving'][1].max_new_tokens})")
    failed = 0
    for name in names:
        row = stats[name]
        reject = row["rejected"]
        m.metric(f"{name}_p", row["p"], bad="none", ratchet=False)
        m.metric(f"{name}_effect", row["effect"], bad="none", ratchet=False)
        if reject:
            failed += 1
            m.fail(kind_of[name],
                   f"{name.replace('_', ' ')} differs: training {row['training']:.4g} vs serving "
                   f"{row['serving']:.4g} ({row['test']}, p = {row['p']:.2g}, effect "
                   f"{row['effect']:+.3g}; Holm at alpha {spec.alpha:g} over {len(names)} tests, "
                   f"{n} samples per prompt per side) {configs}")
    if spec.reward_fn:
        from paritygate.imports import guard_user_code, import_callable

        key = "causal_lm.behaviour.reward_fn"
        reward = guard_user_code(import_callable(spec.reward_fn, ctx.config.path, key),
                                 ctx.config.path, key)
        prompts = [ctx.render_probe("training", p) for i, p in enumerate(ctx.probes)
                   if i in kept]
        rewards = {s: [float(reward(prompts[i // n], t)) for i, t in enumerate(texts[s])]
                   for s in ("training", "serving")}
        diff, low, high = bootstrap_diff(rewards["training"], rewards["serving"],
                                         seed=ctx.config.seed)
        tol = spec.reward_tolerance
        stats["reward"] = {"test": "bootstrap 95%", "effect": diff, "low": low, "high": high,
                           "training": float(np.mean(rewards["training"])),
                           "serving": float(np.mean(rewards["serving"]))}
        m.metric("reward_diff", diff, bad="none", ratchet=False)
        if low > tol or high < -tol:
            failed += 1
            m.fail("reward_differs",
                   f"E[reward] differs: training {stats['reward']['training']:.4g} vs serving "
                   f"{stats['reward']['serving']:.4g}, difference {diff:+.3g} with 95% bootstrap "
                   f"interval [{low:+.3g}, {high:+.3g}] beyond the tolerance {tol:g} "
                   "(causal_lm.behaviour.reward_tolerance; 0.05 is the offline equivalence "
                   f"check's roll-back figure) {configs}")
    m.metric("rejected_tests", failed, threshold=thresholds["rejected_tests"], key=True)
    m.details.update(statistics=stats, samples_per_prompt=n, alpha=spec.alpha,
                     stop_reasons={s: {r: stops[s].count(r) for r in sorted(set(stops[s]))}
                                   for s in stops})
    return m


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
