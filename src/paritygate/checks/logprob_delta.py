"""logprob_delta: the inference engine's token log-probs match the trainer's recompute.

The configured engine (HF ``generate`` with a KV cache on CPU) samples continuations
of the probe prompts under the serving sampling config and reports each token's
log-prob; the trainer's own log-prob function recomputes them teacher-forced.
Thresholds come from the precision tier of (training dtype, engine dtype), see
:mod:`paritygate.metrics.tiers`; a value set under ``thresholds.logprob_delta`` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.causes import Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._delta_records import (
    DeltaRecord,
    EngineInfo,
    EngineRecord,
    PenaltyRecord,
    PerToken,
    TemperatureFit,
    TemperatureRecord,
    TokenDelta,
)
from paritygate.engines.generation import Generation, is_processing_trivial
from paritygate.errors import InputError
from paritygate.metrics.logprob import DeltaStats
from paritygate.metrics.logprob_stream import DETAIL_ROWS
from paritygate.metrics.tiers import PRECISION_TIERS
from paritygate.result import Measurement

if TYPE_CHECKING:
    from collections.abc import Mapping

    from paritygate.engines.generation import Generation, SamplingSpec
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.metrics.tiers import Limits



def _truncation_hint(train_mode: str, engine_mode: str, serving: Any) -> str:
    """Processed log-probs under top-k or top-p on both sides: the engine renormalises over
    the kept tokens, which a trainer function that only divides by the temperature does not
    (HF's ``top_k: 50`` applies wherever ``generation_config.json`` leaves ``top_k`` out)."""
    if not train_mode == engine_mode == "processed":
        return ""
    kept = []
    if serving.top_k:
        kept.append(f"top_k {serving.top_k}"
                    + (" (HF's default where generation_config.json omits top_k)"
                       if serving.top_k == 50 else ""))
    if serving.top_p < 1.0:
        kept.append(f"top_p {serving.top_p:g}")
    if not kept:
        return ""
    return (f"; the engine's processed log-probs are renormalised under {' and '.join(kept)}: "
            "does causal_lm.training.logprob_fn apply the same truncation? (or set top_k: 0 / "
            "top_p: 1.0 where the trainer samples without it)")


def _limit(limits: Limits, tier_key: str, name: str) -> str:
    """A delta limit and its source: the tier's (``0.354 (bf16/fp32 tier; ...)``), the
    config's, or the fp32/fp32 tier the defaults are."""
    if limits.tier is None and limits.sources.get(name) == "default":
        return f"{limits[name]:.3g} ({tier_key} tier)"
    return limits.describe(name)

KINDS: tuple[str, ...] = ("logprob_modes_differ", "sampling_differs", "precision_mismatch",
                          "temperature_mismatch", "penalty_applied")
"""Finding kinds of a token log-prob delta (shared by logprob_delta and vllm_delta)."""

# Defaults are the strictest tier (fp32/fp32, sources in paritygate.metrics.tiers); at run time
# the tier of the configured dtypes replaces them unless the config overrides a value.
DEFAULTS: dict[str, float] = {
    **PRECISION_TIERS["fp32/fp32"],
    # A NaN/Inf log-prob is never acceptable: a non-finite value fails the check by name.
    "nonfinite_tokens": 0.0,
}


DELTA_THRESHOLD_KEYS = (
    "delta_mean_abs",
    "delta_max_abs",
    "delta_p99_abs",
    "ratio_outside_frac",
    "k3_kl",
)


def effective_tier(
    ctx: LMContext, thresholds: Thresholds, engine_dtype: str
) -> tuple[str, dict[str, float], Limits]:
    """The precision tier's key and thresholds, with the user's explicit overrides on top
    (:meth:`~paritygate.families.causal_lm.context.LMContext.served_limits`, the rule every
    LM check shares), and the limits with their sources."""
    from paritygate.metrics.tiers import resolve_tier

    key, _ = resolve_tier(ctx.spec.precision_tier, ctx.spec.training.dtype, engine_dtype)
    limits = ctx.served_limits(
        {name: thresholds[name] for name in DELTA_THRESHOLD_KEYS},
        {name for name in DELTA_THRESHOLD_KEYS if thresholds.is_set(name)},
    )
    values = {name: float(limits[name] or 0.0) for name in DELTA_THRESHOLD_KEYS}
    if "nonfinite_tokens" in thresholds:
        values["nonfinite_tokens"] = float(thresholds["nonfinite_tokens"])
    return key, values, limits


def measure_delta(
    ctx: LMContext, check_id: str, thresholds: Thresholds, engine_name: str
) -> Measurement:
    """Sample with the engine (or read a dump's records), recompute on the training side, and
    judge the delta by tier."""
    m = Measurement(check_id)
    engine_dtype = ctx.spec.engine.dtype
    tier_key, tier, limits = effective_tier(ctx, thresholds, engine_dtype)
    if limits.note() is not None:
        m.note(str(limits.note()))
    training = ctx.training.sampling.spec()
    delta = (_dump_delta(ctx, tier) if engine_name == "dump"
             else _engine_delta(ctx, engine_name, tier))
    stats, serving = delta.stats, delta.serving
    _record_metrics(m, stats, tier)
    # Named causes: configurations that make the two sides score different distributions.
    train_mode = ctx.spec.training.logprobs_mode if training.do_sample else "raw"
    engine_mode = delta.mode
    _named_causes(m, ctx, training, serving, (train_mode, engine_mode), tier_key)
    if ctx.serving.model_dir != ctx.training.model_dir:
        m.note(f"engine loads {ctx.serving.model_dir}, trainer loads {ctx.training.model_dir}")
    if any(metric.breaches() for metric in m.metrics.values()) and (
        "misalignment" not in stats.labels
    ):
        _temperature_fit(m, ctx, delta.fit, training)
    breached = next((n for n, metric in m.metrics.items() if metric.breaches()), None)
    # Whatever the labels: a strong penalty (presence 1.5) decorrelates the two sides' log-probs
    # as a misalignment does; that a penalty predicts the delta is what tells the two apart.
    penalised = breached is not None and _penalty(m, ctx, delta.fit, serving, engine_mode)
    diagnosis = (f"a penalty's shape (penalty_applied), read by the labels as {stats.diagnosis}"
                 if penalised else stats.diagnosis)
    if breached is not None:  # a plain breach: its diagnosis and worst tokens, for people
        worst = ", ".join(
            f"seq {w['seq']} pos {w['pos']} {w.get('text', '')!r} delta {w['delta']:+.3g}"
            for w in stats.worst[:3]
        )
        limits_text = ", ".join(
            f"{name} {m.metrics[name].value:.3g} > {_limit(limits, tier_key, name)}"
            for name in DELTA_THRESHOLD_KEYS if m.metrics[name].breaches())
        m.hint(breached, f"log-probs disagree beyond the {tier_key} tier: {diagnosis}; "
               f"worst: {worst}" + (f" ({limits_text})" if limits_text else "")
               + _truncation_hint(train_mode, engine_mode, serving))
    m.note(f"diagnosis: {stats.diagnosis}")
    details = stats.to_details()
    details.pop("per_token", None)
    m.record(DeltaRecord({"name": tier_key, **tier}, details))
    m.record(PerToken([TokenDelta(int(t["seq"]), int(t["pos"]), t["delta"])
                       for t in delta.per_token]))
    if delta.note:
        m.note(delta.note)
    m.record(EngineRecord(EngineInfo(delta.engine, engine_mode, engine_dtype)))
    if engine_name == "endpoint":
        from paritygate.engines.openai_endpoint import server_findings

        for note in server_findings(ctx.engines[engine_name]):
            m.note(note)
    return m


@dataclass(frozen=True)
class FitSample:
    """The sequences the temperature fit reads (the trainer's logits over each): every one
    of an engine's generation; a dump's first records, up to :data:`FIT_LOGITS`."""

    generation: Generation
    logp_infer: np.ndarray
    """The engine's log-probs, (B, L), row ``i`` for ``generation``'s row ``i``."""


@dataclass(frozen=True)
class EngineDelta:
    """What ``measure_delta`` judges: the statistics and where they came from."""

    stats: DeltaStats
    serving: SamplingSpec
    mode: str
    engine: str
    per_token: list[dict[str, float]]
    fit: FitSample
    note: str = ""


def _engine_delta(ctx: LMContext, engine_name: str, tier: Mapping[str, float]) -> EngineDelta:
    """An engine's sampled generation (small: the probes) recomputed and compared at once."""
    from paritygate.metrics.logprob import delta_stats

    generation, serving = ctx.generations.sampled(engine_name)
    logp_train, logp_infer, mask = ctx.generations.recompute(generation)
    tok = ctx.serving.tokenizer

    def token_text(seq: int, pos: int) -> str:
        return str(tok.decode([generation.output_ids[seq][pos]]))

    stats = delta_stats(
        logp_train, logp_infer, mask, eps=ctx.spec.ratio_eps, token_text=token_text, tier=tier
    )
    per_token = [
        {"seq": s, "pos": p, "delta": float(logp_train[s, p] - logp_infer[s, p])}
        for s, p in zip(*np.nonzero(mask), strict=True)
    ][:DETAIL_ROWS]
    return EngineDelta(stats, serving, generation.logprobs_mode, generation.engine, per_token,
                       FitSample(generation, logp_infer))


FIT_LOGITS = 2**24
"""Logits (tokens x vocabulary) a dump's temperature fit reads at most: 64 MiB of float32."""


def _dump_delta(ctx: LMContext, tier: Mapping[str, float]) -> EngineDelta:
    """A dump's sampled records recomputed and compared batch by batch
    (:class:`~paritygate.metrics.logprob_stream.DeltaAccumulator`): memory is one batch and
    the top 1% of deltas, whatever the dump's size. The temperature fit, run only on a breach,
    reads the first records up to :data:`FIT_LOGITS` logits."""
    from paritygate.metrics.logprob_stream import DeltaAccumulator

    part = ctx.generations.dump_summary.sampled
    if part.records == 0 or part.sampling is None:
        raise InputError(ctx.config.resolve(ctx.spec.engine.dump or ""), None,
                         "the dump holds no sampled record (all are greedy)")
    acc = DeltaAccumulator(part.tokens, eps=ctx.spec.ratio_eps, tier=tier)
    vocab = max(1, ctx.generations.dump_summary.vocab_size or 1)
    fit: FitSample | None = None
    engine = "dump"
    for generation in ctx.generations.dump_batches(greedy=False):
        logp_train, logp_infer, mask = ctx.generations.recompute(generation)
        acc.add(logp_train, logp_infer, mask, generation.output_ids)
        if fit is None:
            engine = generation.engine
            fit = _fit_sample(generation, logp_infer, FIT_LOGITS // vocab)
    assert fit is not None  # the part holds records
    tok = ctx.serving.tokenizer
    stats = acc.result(token_text=lambda token: str(tok.decode([token])))
    note = ""
    if part.records > DETAIL_ROWS:
        note = (f"the report lists the first {DETAIL_ROWS} of the dump's {part.records} sampled "
                "records per sequence and the first tokens; every statistic covers them all")
    return EngineDelta(stats, part.sampling, part.mode or "processed", engine, acc.per_token,
                       fit, note)


def _fit_sample(generation: Generation, logp_infer: np.ndarray, tokens: int) -> FitSample:
    """The first rows of ``generation`` whose tokens (and one step after each) add up to at
    most ``tokens`` (at least one row)."""
    stop = generation.spans(tokens)[0][1]
    return FitSample(generation.rows(0, stop), logp_infer[:stop])


def _record_metrics(m: Measurement, stats: DeltaStats, tier: Mapping[str, float]) -> None:
    """The delta statistics as metrics, judged by the tier's bounds where it has one."""
    values = stats.as_metrics()
    m.metric(
        "delta_mean_abs", abs(values["delta_mean"]), threshold=tier["delta_mean_abs"], unit="nats"
    )
    m.metric(
        "delta_max_abs",
        values["delta_max_abs"],
        threshold=tier["delta_max_abs"],
        unit="nats",
        key=True,
    )
    m.metric("delta_p99_abs", values["delta_p99_abs"], threshold=tier["delta_p99_abs"], unit="nats")
    m.metric(
        "ratio_outside_frac", values["ratio_outside_frac"], threshold=tier["ratio_outside_frac"]
    )
    m.metric("k3_kl", values["k3_kl"], threshold=tier["k3_kl"], unit="nats")
    m.metric(
        "nonfinite_tokens", values["nonfinite_tokens"], threshold=tier.get("nonfinite_tokens", 0.0)
    )
    m.metric("delta_mean", values["delta_mean"], bad="none", unit="nats")
    m.metric("delta_std", values["delta_std"], bad="none", unit="nats")
    m.metric("prob_diff_mean", values["prob_diff_mean"], bad="none")
    m.metric("prob_diff_max", values["prob_diff_max"], bad="none")
    m.metric("n_tokens", values["n_tokens"], bad="none", ratchet=False)
    for name, value in stats.correction.items():
        m.metric(f"rc_{name}", value, bad="none", ratchet=False)



def _named_causes(
    m: Measurement, ctx: LMContext, training: SamplingSpec, serving: SamplingSpec,
    modes: tuple[str, str], tier_key: str,
) -> None:
    """Fail by name the configurations that make reference and candidate score different
    distributions: log-prob modes, processing knobs, a precision other than the tier's."""
    from paritygate.metrics.tiers import canonical_dtype

    train_mode, engine_mode = modes
    engine_dtype = ctx.spec.engine.dtype
    if train_mode != engine_mode and not (
        is_processing_trivial(training) and is_processing_trivial(serving)
    ):
        processed = serving if engine_mode == "processed" else training
        side = "engine" if engine_mode == "processed" else "trainer"
        m.fail(
            "logprob_modes_differ",
            f"log-prob modes differ: trainer scores {train_mode} log-probs, engine reports "
            f"{engine_mode} (temperature {processed.temperature:g}, top_k {processed.top_k}, "
            f"top_p {processed.top_p:g} applied on the {side} side only)"
        )
    if train_mode == engine_mode == "processed":
        for name in ("temperature", "top_k", "top_p"):
            t_val, s_val = getattr(training, name), getattr(serving, name)
            if t_val != s_val:
                source = ("as its dump records say" if "dump" in ctx.spec.engines
                          else "see sampling_config")  # fmt: skip
                m.fail(
                    "sampling_differs",
                    f"{name} differs: trainer recomputes with {t_val:g}, engine sampled with "
                    f"{s_val:g} ({source})"
                )
    if ctx.spec.precision_tier:
        actual = f"{canonical_dtype(ctx.spec.training.dtype)}/{canonical_dtype(engine_dtype)}"
        if actual != tier_key and actual[::-1] != tier_key:
            m.fail(
                "precision_mismatch",
                f"precision mismatch: trainer {ctx.spec.training.dtype} vs engine "
                f"{engine_dtype}, but the gate's precision tier is {tier_key}"
            )


def _penalty(m: Measurement, ctx: LMContext, fit: FitSample, serving: SamplingSpec,
             engine_mode: str) -> bool:
    """Name a penalty when one predicts the delta: the trainer's logits with a fitted
    repetition, presence or frequency penalty on the tokens already seen give the engine's
    log-probs (:mod:`paritygate.metrics.logprob_penalty`), whatever the configs say. Read on
    the fit sample (an engine's whole generation; a dump's first records)."""
    from paritygate.metrics.logprob_penalty import fit_penalty, seen_tokens

    if engine_mode != "processed":
        return False  # raw log-probs are read before any penalty
    generation = fit.generation
    logp_train, _, mask = ctx.generations.recompute(generation)
    train, infer = np.asarray(logp_train, np.float64), np.asarray(fit.logp_infer, np.float64)
    valid = np.asarray(mask, bool) & np.isfinite(train) & np.isfinite(infer)
    if not valid.any():
        return False
    training = ctx.training.sampling.spec()
    applied = {name: float(getattr(training, name))
               for name in ctx.spec.training.logprob_applies if hasattr(training, name)}
    seen = seen_tokens(ctx.generations.teacher_forced(generation), generation.prompt_ids,
                       generation.output_ids, valid, serving.temperature)
    found = fit_penalty(seen, (train - infer)[valid], applied)
    m.record(PenaltyRecord(found.as_details()))
    if not found.penalty:
        return False
    stated = [f"{name} {value:g}" for name, value, neutral in (
        ("repetition_penalty", serving.repetition_penalty, 1.0),
        ("presence_penalty", serving.presence_penalty, 0.0),
        ("frequency_penalty", serving.frequency_penalty, 0.0)) if value != neutral]
    source = (f"the serving config sets {', '.join(stated)} (see sampling_config)" if stated
              else "no penalty in the serving config: does the engine add one?")
    m.fail("penalty_applied",
           f"a penalty on repeated tokens: {found.describe()}; {source}: the engine's "
           "log-probs are of the penalised distribution the trainer's recompute does not apply")
    return True


def _temperature_fit(m: Measurement, ctx: LMContext, fit: FitSample, training: Any) -> None:
    """Name a temperature mismatch: rescaling the trainer's logits by one factor explains the
    engine's log-probs (the shared teacher-forced forward, only on a breach)."""
    from paritygate.metrics.logprob_correction import (
        TEMPERATURE_EXPLAINED,
        TEMPERATURE_MIN_CHANGE,
        fit_temperature_ratio,
    )

    if ctx.spec.training.logprobs_mode != "processed" or not training.do_sample:
        return
    if training.top_k or training.top_p < 1.0:
        return  # a filtered distribution is not a rescaled softmax
    generation, logp_infer = fit.generation, fit.logp_infer
    rows, toks, infer = [], [], []
    teacher = ctx.generations.teacher_forced(generation)  # one batched forward over every sequence
    for i, output in enumerate(generation.output_ids):
        if not output:
            continue
        rows.append(teacher[i][: len(output)])
        toks.append(np.asarray(output))
        infer.append(logp_infer[i, : len(output)])
    if not rows:
        return
    t_train = training.temperature if training.temperature > 0 else 1.0
    ratio, explained = fit_temperature_ratio(
        np.concatenate(rows), np.concatenate(toks), np.concatenate(infer), t_train
    )
    m.record(TemperatureRecord(TemperatureFit(ratio, explained)))
    if explained >= TEMPERATURE_EXPLAINED and abs(ratio - 1.0) > TEMPERATURE_MIN_CHANGE:
        m.fail(
            "temperature_mismatch",
            f"temperature mismatch: the engine's log-probs are the trainer's logits at "
            f"temperature {ratio * t_train:.3g} instead of {t_train:g} (fitted ratio "
            f"T_engine / T_trainer = {ratio:.3g}, explains {explained:.0%} of the squared delta)"
        )


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    engine = next((e for e in ctx.spec.engines if e != "vllm"), None)
    if engine is None:
        return Measurement("logprob_delta").skip(
            "engines: [vllm] only: vllm_delta measures vLLM's log-probs"
        )
    return measure_delta(ctx, "logprob_delta", thresholds, engine)


CHECK = CheckSpec(
    id="logprob_delta",
    summary="engine token log-probs match the trainer's teacher-forced recompute",
    measures={"causal_lm": measure},
    downstream=True,
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=KINDS,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("logprob_delta", "pinned_tier_mismatch", ("precision_mismatch",),
                ("logits_agreement", "generation_parity", "batch_invariance"),
                "the engine computes in another precision than the pinned tier judges",
                fix="pin the served precision's tier (causal_lm.precision_tier) or serve in "
                    "the pinned precision",
                rank=280),
    Explanation("logprob_delta", "penalty_applied", ("penalty_applied",),
                ("behaviour_parity", "vllm_delta"),
                "the engine lowers the log-probs of tokens already in the context (a "
                "penalty) where the trainer's recompute does not",
                fix="serve without the penalty (repetition_penalty 1, presence_penalty and "
                    "frequency_penalty 0), or apply it in causal_lm.training.logprob_fn and "
                    "declare it in causal_lm.training.logprob_applies",
                rank=325),
)

POSITION = 130
"""The check's place in the checklist (and in every report): the registry sorts by it."""
