"""The training side's recompute of an engine's generations, and the delta measurement.

``logprob_delta`` (HF engine) and ``vllm_delta`` (vLLM) share this: the engine
samples continuations of the probe prompts and reports each token's log-prob;
the trainer's log-prob function (the one named in the config) recomputes them
with one teacher-forced forward over ``prompt + output`` (left-padded batches,
eval mode); :func:`paritygate.lm.delta.delta_stats` summarises the difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.lm.engine import Generation, SamplingSpec
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.lm.context import LMContext

DELTA_THRESHOLD_KEYS = (
    "delta_mean_abs",
    "delta_max_abs",
    "delta_p99_abs",
    "ratio_outside_frac",
    "k3_kl",
)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """``(B, T)`` input ids and attention mask, each row right-aligned."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask


def processing_args(sampling: SamplingSpec) -> dict[str, Any]:
    """The sampling knobs a processed log-prob depends on, in compute_logprobs' terms."""
    return {
        "temperature": sampling.temperature if sampling.temperature > 0 else 1.0,
        "top_k": sampling.top_k or None,
        "top_p": sampling.top_p if sampling.top_p < 1.0 else None,
    }


def is_processing_trivial(sampling: SamplingSpec) -> bool:
    """True when processed and raw log-probs coincide (T=1, no top-k/top-p)."""
    return sampling.temperature in (0.0, 1.0) and not sampling.top_k and sampling.top_p >= 1.0


def recompute(
    ctx: LMContext, generation: Generation, *, batch_size: int = 8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trainer log-probs of every generated token: ``(logp_train, logp_infer, mask)``, (B, L)."""
    sampling = ctx.training_sampling.spec()
    mode = ctx.spec.training.logprobs_mode
    if not sampling.do_sample:
        mode = "raw"
    model = ctx.reference_model()
    pad = ctx.training_tokenizer.pad_token_id
    pad = 0 if pad is None else pad
    n = len(generation.output_ids)
    width = max((len(o) for o in generation.output_ids), default=0)
    logp_train = np.zeros((n, max(width, 1)), dtype=np.float64)
    logp_infer = np.zeros_like(logp_train)
    mask = np.zeros(logp_train.shape, dtype=bool)
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        seqs = [generation.prompt_ids[i] + generation.output_ids[i] for i in rows]
        ids, attn = left_pad(seqs, pad)  # (B, T)
        out = ctx.logprob_fn(model, ids, attn, mode=mode, **processing_args(sampling))
        out = out.detach().float().cpu().numpy()  # (B, T-1)
        total = ids.shape[1]
        for b, i in enumerate(rows):
            k = len(generation.output_ids[i])
            if k == 0:
                continue
            # Generated token j sits at column total-k+j; its log-prob at column total-k+j-1.
            logp_train[i, :k] = out[b, total - k - 1 : total - 1]
            logp_infer[i, :k] = generation.logprobs[i]
            mask[i, :k] = True
    return logp_train, logp_infer, mask


def effective_tier(
    ctx: LMContext, check_id: str, thresholds: Mapping[str, float], engine_dtype: str
) -> tuple[str, dict[str, float]]:
    """The precision tier's thresholds, with the user's explicit overrides on top."""
    from paritygate.lm.tiers import PRECISION_TIERS, tier_for

    if ctx.spec.precision_tier:
        key = ctx.spec.precision_tier
        if key not in PRECISION_TIERS:
            raise ValueError(f"unknown precision tier {key!r}; known: {', '.join(PRECISION_TIERS)}")
        values = dict(PRECISION_TIERS[key])
    else:
        key, values = tier_for(ctx.spec.training.dtype, engine_dtype)
    overrides = ctx.config.thresholds.get(check_id, {})
    for name in DELTA_THRESHOLD_KEYS:
        if name in overrides:
            values[name] = float(thresholds[name])
    if "nonfinite_tokens" in thresholds:
        values["nonfinite_tokens"] = float(thresholds["nonfinite_tokens"])
    return key, values


def measure_delta(
    ctx: LMContext, check_id: str, thresholds: Mapping[str, float], engine_name: str
) -> Measurement:
    """Sample with the engine, recompute on the training side, and judge the delta by tier."""
    from paritygate.lm.delta import delta_stats
    from paritygate.lm.tiers import canonical_dtype

    m = Measurement(check_id)
    engine_dtype = ctx.spec.engine.dtype
    tier_key, tier = effective_tier(ctx, check_id, thresholds, engine_dtype)
    generation, serving = ctx.sampled(engine_name)
    training = ctx.training_sampling.spec()
    logp_train, logp_infer, mask = recompute(ctx, generation)
    tok = ctx.serving_tokenizer

    def token_text(seq: int, pos: int) -> str:
        return str(tok.decode([generation.output_ids[seq][pos]]))

    stats = delta_stats(
        logp_train, logp_infer, mask, eps=ctx.spec.ratio_eps, token_text=token_text, tier=tier
    )
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

    # Named causes: configurations that make the two sides score different distributions.
    train_mode = ctx.spec.training.logprobs_mode if training.do_sample else "raw"
    engine_mode = generation.logprobs_mode
    if train_mode != engine_mode and not (
        is_processing_trivial(training) and is_processing_trivial(serving)
    ):
        processed = serving if engine_mode == "processed" else training
        side = "engine" if engine_mode == "processed" else "trainer"
        m.fail(
            f"log-prob modes differ: trainer scores {train_mode} log-probs, engine reports "
            f"{engine_mode} (temperature {processed.temperature:g}, top_k {processed.top_k}, "
            f"top_p {processed.top_p:g} applied on the {side} side only)"
        )
    if train_mode == engine_mode == "processed":
        for name in ("temperature", "top_k", "top_p"):
            t_val, s_val = getattr(training, name), getattr(serving, name)
            if t_val != s_val:
                m.fail(
                    f"{name} differs: trainer recomputes with {t_val:g}, engine sampled with "
                    f"{s_val:g} (see sampling_config)"
                )
    if ctx.spec.precision_tier:
        actual = f"{canonical_dtype(ctx.spec.training.dtype)}/{canonical_dtype(engine_dtype)}"
        if actual != tier_key and actual[::-1] != tier_key:
            m.fail(
                f"precision mismatch: trainer {ctx.spec.training.dtype} vs engine "
                f"{engine_dtype}, but the gate's precision tier is {tier_key}"
            )
    if ctx.engine_model_dir != ctx.model_dir:
        m.note(f"engine loads {ctx.engine_model_dir}, trainer loads {ctx.model_dir}")
    if any(metric.breaches() for metric in m.metrics.values()):
        worst = ", ".join(
            f"seq {w['seq']} pos {w['pos']} {w.get('text', '')!r} delta {w['delta']:+.3g}"
            for w in stats.worst[:3]
        )
        m.fail(f"log-probs disagree beyond the {tier_key} tier: {stats.diagnosis}; worst: {worst}")
    m.note(f"diagnosis: {stats.diagnosis}")
    m.details["tier"] = {"name": tier_key, **tier}
    details = stats.to_details()
    details.pop("per_token", None)
    m.details["delta"] = details
    m.details["per_token"] = [
        {"seq": s, "pos": p, "delta": float(logp_train[s, p] - logp_infer[s, p])}
        for s, p in zip(*np.nonzero(mask), strict=True)
    ][:512]
    m.details["engine"] = {
        "name": generation.engine,
        "logprobs_mode": engine_mode,
        "dtype": engine_dtype,
    }
    return m
