"""logprob_impl: the training-side log-prob function has the semantics PPO/GRPO assume.

Runs the function named in ``causal_lm.training.logprob_fn`` (and the library's
reference :func:`paritygate.families.causal_lm.logprobs.compute_logprobs` when that is another
function) on the probe prompts and proves: it equals
``torch.distributions.Categorical(logits).log_prob`` with position ``t`` scoring
token ``t + 1``; every row equals its unpadded single-sequence result whatever the
left-padding amount, pad token value and batch composition; positions whose
target is a pad are exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.causes import Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.metrics.logprob_semantics import Tolerances, run_suite
from paritygate.records import Keyed, Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext

REFERENCE_FN = "paritygate.families.causal_lm.logprobs:compute_logprobs"

DEFAULTS: dict[str, float] = {
    # Same forward, two log-softmax implementations: fp32 agrees to a few ulps of the
    # logit scale (|logit| ~ 10 -> ~1e-6); 1e-5 leaves 10x margin.
    "categorical_max_abs": 1e-5,
    # Padded vs unpadded runs differ only by fp32 reduction order: the fp32/fp32 tier's
    # delta_max_abs (paritygate.metrics.tiers).
    "padding_max_abs": 1e-4,
    "batch_max_abs": 1e-4,
    # A pad target must contribute exactly nothing to the sequence log-prob.
    "pad_targets_nonzero": 0.0,
    # Processed mode: same forward, log_softmax(logits / T); same bound as categorical_max_abs.
    "temperature_max_abs": 1e-5,
    # TRL's layout: a right pad after EOS must score exactly 0.
    "pads_after_eos_nonzero": 0.0,
    # Real completion tokens in the RL layout vs unpadded: fp32 reduction order, as padding.
    "rl_layout_max_abs": 1e-4,
}
NEW_METRICS = ("temperature_max_abs", "pads_after_eos_nonzero", "rl_layout_max_abs")
LAYOUT_KEYS = ("padding_max_abs", "batch_max_abs", "rl_layout_max_abs")
LAYOUT_NOISE_FACTOR = 4.0
"""A trainer in bfloat16/float16 moves a correct function's log-probs with the layout by that
precision's rounding (demo LM in bf16: 0.057 nats, padded vs unpadded); the reference
implementation, correct by construction, measures that floor on the same model and layouts, and
a layout metric fails above this many times it. A mask not passed moves them by 6.3 nats
(100x the floor), so the factor leaves the fault far outside and the noise well inside."""


SHIFT_BUDGET_METRIC = "delta_max_abs"
"""Omitting ``position_ids`` makes the positions of each left-padded row start at its pad count.
That is a layout effect of the trainer's function, judged by what it does to the quantity the
gate protects: it fails only when it moves a real token's log-prob by more than the precision
tier of ``logprob_delta`` allows one token (``delta_max_abs``, :mod:`paritygate.metrics.tiers`).
Rotary attention (Llama, Qwen2) depends on relative positions only, so there the shift is
rounding (demo LM, fp32: 1.4e-5 nats, 7x below the fp32/fp32 tier's 1e-4) and is reported as a
note with its size; absolute position embeddings (GPT-2, OPT) move log-probs by far more."""

TEST_TEMPERATURE = 0.7
"""Temperature used to test processed mode when the trainer's config samples at T = 1."""


@dataclass(frozen=True)
class Convention(Record):
    """The trainer function's log-prob convention and the temperature of processed ones."""

    convention: str
    processed_temperature: float | None


def _layout_limits(m: Measurement, dtype: str, reference: dict[str, float],
                   thresholds: Thresholds, limits: dict[str, float]) -> Tolerances:
    """Raise the layout bounds (unless the config set them) to the trainer precision's floor,
    measured by the reference implementation; ``limits`` is updated in place."""
    floor = max(reference.get(key, 0.0) for key in LAYOUT_KEYS)
    for key in LAYOUT_KEYS:
        if not thresholds.is_set(key):
            limits[key] = max(limits[key], LAYOUT_NOISE_FACTOR * floor)
    m.note(f"the trainer runs in {dtype}: the reference implementation's own padding, batch "
           f"and RL-layout differences (up to {floor:.3g}) are that precision's rounding; "
           f"layouts are judged at {LAYOUT_NOISE_FACTOR:g}x that floor "
           f"({limits['padding_max_abs']:.3g}) unless thresholds.logprob_impl sets them")
    return Tolerances(DEFAULTS["categorical_max_abs"], limits["padding_max_abs"])


def _shift_budget(ctx: LMContext) -> tuple[str, float]:
    """The precision tier ``logprob_delta`` judges this gate by, and its per-token bound."""
    from paritygate.metrics.tiers import PRECISION_TIERS

    key = ctx.spec.precision_tier or ctx.spec.tier()
    return key, float(PRECISION_TIERS[key][SHIFT_BUDGET_METRIC])


def _judge_position_shift(
    m: Measurement, name: str, shift: float, budget: tuple[str, float]
) -> None:
    """A missing-position-ids shift fails above the tier's per-token bound, else is a note."""
    tier, limit = budget
    m.metric("position_shift_max_abs", shift, threshold=limit, ratchet=False)
    if shift > limit:
        m.fail(
            "position_ids",
            f"{name}: position ids not passed: left padding shifts the positions of real "
            f"tokens, moving their log-probs by up to {shift:.3g} > {limit:g}, the "
            f"{tier} tier's {SHIFT_BUDGET_METRIC} (pass position_ids = cumsum(attention_mask) "
            "- 1)"
        )
    elif shift > 0.0:
        m.note(
            f"{name}: position ids not passed: left padding moves real tokens' log-probs by up "
            f"to {shift:.3g}, within the {tier} tier's {SHIFT_BUDGET_METRIC} {limit:g} "
            "(rotary positions: the shift is rounding)"
        )


_PLAIN_SOFTMAX = ("categorical_max_abs", "temperature_max_abs")
"""Metrics that measure agreement with the plain softmax: not judged for a function declared
to apply a transform (``causal_lm.training.logprob_applies``)."""


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.imports import import_callable

    m = Measurement("logprob_impl")
    model = ctx.training.model()
    seqs = [s for s in ctx.training.prompts if len(s) >= 2]
    if not seqs:
        return m.skip("no probe prompt has two or more tokens")
    pad = ctx.training.tokenizer.pad_token_id or 0
    user_name = ctx.spec.training.logprob_fn
    subjects = [("", user_name, ctx.logprobs.fn)]
    if user_name != REFERENCE_FN:
        ref = import_callable(REFERENCE_FN, ctx.config.path, "causal_lm.training.logprob_fn")
        subjects.insert(0, ("reference_", REFERENCE_FN, ref))
    helpers = ctx.logprobs.helpers
    shift_budget = _shift_budget(ctx)
    eos = ctx.training.tokenizer.eos_token_id
    eos = pad if eos is None else eos
    tol = Tolerances(DEFAULTS["categorical_max_abs"], DEFAULTS["padding_max_abs"])
    t_cfg = ctx.training.sampling.spec().temperature
    temperature = t_cfg if t_cfg not in (0.0, 1.0) else TEST_TEMPERATURE
    limits = {key: thresholds[key] for key in DEFAULTS}
    floor_pending = ctx.spec.training.dtype != "float32"
    applies = ctx.spec.training.logprob_applies
    if applies:
        m.note(f"{user_name} applies {', '.join(applies)} (causal_lm.training.logprob_applies): "
               "its log-probs are of the transformed distribution, so only its padding, batch "
               "and mask semantics are checked, not its agreement with the plain softmax")
    floors: dict[str, float] = {}
    for prefix, name, fn in subjects:
        floor_run = floor_pending and name == REFERENCE_FN
        own = tol
        if floor_run:
            own = Tolerances(tol.categorical, math.inf)
        elif applies and not prefix:
            own = Tolerances(math.inf, tol.padding)
        res = run_suite(
            fn, model, seqs, pad, eos=eos, temperature=temperature, helpers=helpers,
            logits_level=getattr(fn, "convention", "model") == "logits", tol=own,
        )
        if floor_run:
            floor_pending = False
            tol = _layout_limits(m, ctx.spec.training.dtype, res.metrics(), thresholds, limits)
        if res.nonfinite_logits is not None:  # the model, not a function: one cause
            m.fail("nonfinite_logits", res.nonfinite_logits)
            break
        for kind, cause in res.causes:
            m.fail(kind, f"{name}: {cause}")
        if not prefix and res.position_shift_max_abs is not None:
            _judge_position_shift(m, name, res.position_shift_max_abs, shift_budget)
        values = res.metrics()
        # the reference implementation's numbers on this model are the user's metrics' floor
        floors = values if prefix else floors
        for key in DEFAULTS:
            if key in values:
                transformed = own.categorical == math.inf and key in _PLAIN_SOFTMAX
                m.metric(
                    prefix + key,
                    values[key],
                    threshold=None if transformed else limits[key],
                    bad="none" if transformed else "higher",
                    key=(key == "categorical_max_abs" and not prefix),
                    ratchet=key not in NEW_METRICS,
                    limit_key=key,
                    noise=None if prefix else floors.get(key),
                )
        m.record(Keyed(f"{prefix or 'user_'}function", name))
    m.record(Convention(getattr(ctx.logprobs.fn, "convention", "model"), temperature))
    m.metric("sequences", len(seqs), bad="none", ratchet=False)
    return m


CHECK = CheckSpec(
    id="logprob_impl",
    summary="training-side log-prob function: Categorical semantics, t scores t+1, pads excluded",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("nonfinite_logits", "output_shape", "nonfinite_logprobs", "off_by_one",
           "temperature_ignored", "temperature_wrong", "low_precision", "pads_counted",
           "padding_leak", "pads_after_eos", "position_ids"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("logprob_impl", "logprob_recompute", None,
                ("logprob_delta",),
                "the trainer's log-prob recompute is wrong, so its deltas to the engine are too",
                rank=270),
)

POSITION = 120
"""The check's place in the checklist (and in every report): the registry sorts by it."""
