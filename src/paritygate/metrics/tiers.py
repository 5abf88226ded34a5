"""Precision tiers: how far trainer and engine token log-probs may drift apart.

Keyed ``"<training dtype>/<inference dtype>"``. Each tier bounds the statistics
of ``delta = logp_train - logp_infer`` on sampled tokens (see
:mod:`paritygate.metrics.logprob`):

- ``delta_max_abs``: worst single token, nats.
- ``delta_p99_abs``: 99th percentile of |delta|, nats.
- ``delta_mean_abs``: bound on ``|delta_mean|`` (a systematic offset), nats.
- ``ratio_outside_frac``: fraction of tokens whose ratio ``exp(delta)`` leaves
  ``[1 - eps, 1 + eps]`` (eps = 0.2, PPO's clip range) before any update.
- ``k3_kl``: the k3 estimate of ``KL(engine || trainer)`` per token, nats.

Where the numbers come from
---------------------------
Rounding: unit roundoff is 2^-24 = 5.96e-8 (fp32), 2^-11 = 4.88e-4 (fp16),
2^-8 = 3.91e-3 (bf16). A logit error ``dz`` moves a log-softmax entry by
``dz_i - sum_j p_j dz_j``, at most ``2 max|dz|``; the logit error itself grows
with the length of each dot product (about sqrt(K) unit roundoffs for random
rounding) and with depth. Rounding errors are unbiased, so a mean offset of
more than a few ulps points to a one-sided transform (temperature applied on
one side, raw vs processed log-probs), not to precision.

Published observations of train/inference mismatch in LLM RL:

- F. Yao, L. Liu et al., "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training" (fengyao.notion.site/off-policy-rl, 2025) and the
  talk "On the Rollout-Training Mismatch in Modern RL Systems": vLLM (rollout)
  vs FSDP (training) token probabilities of the same bf16 model differ by up
  to 1.0 (DAPO Qwen2.5-32B); they correct with truncated importance sampling,
  which caps the ratio at C = 2.
- NVIDIA NeMo RL, "Add New Models" guide (docs.nvidia.com/nemo/rl/latest/
  adding-new-models.html) measures ``mean(exp(|delta|))`` ("multiplicative
  probability error", samples from the inference framework); its CI suites
  (github.com/NVIDIA-NeMo/RL, tests/test_suites/llm/*.sh) require
  ``train/token_mult_prob_error`` median < 1.1, max < 1.05 in the strict
  async-PPO suite, and ``mean(train/gen_kl_error) < 0.01`` for bf16 training
  against vLLM.
- P. Qi et al., "Defeating the Training-Inference Mismatch via FP16"
  (arXiv:2510.26788): bf16's rounding is the main source of the mismatch;
  fp16 on both sides largely removes it.
- vLLM's ``logprobs_mode`` (vllm/config/model.py, ModelConfig.logprobs_mode):
  ``raw_logprobs`` (default) are before temperature/top-k/top-p,
  ``processed_logprobs`` after; comparing one with the other is a systematic
  bias, not a precision effect, and no tier excuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

_U_FP32 = 2.0**-24
_U_FP16 = 2.0**-11
_U_BF16 = 2.0**-8
_SQRT2 = 2.0**0.5

PRECISION_TIERS: dict[str, dict[str, float]] = {
    "fp32/fp32": {
        # ~1700 u_fp32: sqrt(K) ~ 64 per reduction, tens of layers, x2 from the
        # log-softmax; the same figure as logits_agreement's max_abs_diff (1e-4) on logits.
        "delta_max_abs": 1e-4,
        # Typical tokens: 5x tighter than the worst one (~340 u_fp32).
        "delta_p99_abs": 2e-5,
        # Unbiased fp32 rounding averages out; 1e-6 is ~17 u_fp32.
        "delta_mean_abs": 1e-6,
        # Leaving [0.8, 1.2] needs |delta| >= 0.18, 1800x delta_max_abs: never.
        "ratio_outside_frac": 0.0,
        # k3 ~ E[delta^2] / 2 <= (2e-5)^2 / 2 = 2e-10; 5x margin.
        "k3_kl": 1e-9,
    },
    "bf16/bf16": {
        # Below ln 2 = 0.69 so no token reaches the truncated-IS cap C = 2 (Yao et al.),
        # whose bf16 vLLM-vs-FSDP runs show probability differences up to 1.0.
        "delta_max_abs": 0.5,
        # ~25 u_bf16; NeMo RL's CI bound mean(exp|delta|) < 1.1 allows mean |delta| ~ 0.095.
        "delta_p99_abs": 0.1,
        # ~2.5 u_bf16 of systematic offset; beyond that something one-sided is applied.
        "delta_mean_abs": 0.01,
        # 1% of tokens outside PPO's clip range [0.8, 1.2] before the first update.
        "ratio_outside_frac": 0.01,
        # One tenth of NeMo RL's CI alarm mean(gen_kl_error) < 0.01.
        "k3_kl": 1e-3,
    },
    "fp16/fp16": {
        # fp16 rounds 8x finer than bf16 (2^-11 vs 2^-8): delta bounds / 8, k3 / 64;
        # Qi et al. observe fp16 on both sides largely removes the bf16 mismatch.
        "delta_max_abs": 0.5 / 8,
        "delta_p99_abs": 0.1 / 8,
        "delta_mean_abs": 0.01 / 8,
        # p99 0.0125 sits far inside [0.8, 1.2] (|delta| 0.18); 0.1% for rare outliers.
        "ratio_outside_frac": 0.001,
        "k3_kl": 1e-3 / 64,
    },
    "bf16/fp32": {
        # Only the training side rounds at bf16: independent errors add in quadrature,
        # so the bf16/bf16 delta bounds / sqrt(2) and k3 / 2.
        "delta_max_abs": 0.5 / _SQRT2,
        "delta_p99_abs": 0.1 / _SQRT2,
        "delta_mean_abs": 0.01 / _SQRT2,
        "ratio_outside_frac": 0.005,
        "k3_kl": 1e-3 / 2,
    },
    "fp16/fp32": {
        # fp16/fp16 bounds / sqrt(2), k3 / 2 (one rounded side, as for bf16/fp32).
        "delta_max_abs": 0.5 / 8 / _SQRT2,
        "delta_p99_abs": 0.1 / 8 / _SQRT2,
        "delta_mean_abs": 0.01 / 8 / _SQRT2,
        "ratio_outside_frac": 0.0005,
        "k3_kl": 1e-3 / 64 / 2,
    },
}

UNIT_ROUNDOFF: dict[str, float] = {"fp32": _U_FP32, "fp16": _U_FP16, "bf16": _U_BF16}

_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "f32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "f16": "fp16",
}


def canonical_dtype(name: object) -> str:
    """``"float32"``, ``torch.float32``, ``"half"``... -> ``"fp32"`` / ``"fp16"`` / ``"bf16"``."""
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown dtype {name!r}; expected one of fp32, bf16, fp16")
    return _ALIASES[key]


def tier_for(train_dtype: str, infer_dtype: str) -> tuple[str, dict[str, float]]:
    """The tier for a (training dtype, inference dtype) pair: ``(key, thresholds)``.

    A pair listed only the other way round (``fp32/bf16``) uses its mirror
    (``bf16/fp32``): the error of the lower-precision side is the same whichever
    side it is on. Mixed bf16/fp16 pairs have no tier and raise ``ValueError``.
    """
    train, infer = canonical_dtype(train_dtype), canonical_dtype(infer_dtype)
    for key in (f"{train}/{infer}", f"{infer}/{train}"):
        if key in PRECISION_TIERS:
            return key, dict(PRECISION_TIERS[key])
    raise ValueError(
        f"no precision tier for training {train} vs inference {infer}; "
        f"known tiers: {', '.join(PRECISION_TIERS)}"
    )


def logits_thresholds(tier: Mapping[str, float]) -> dict[str, float | None]:
    """``logits_agreement``'s thresholds for an LM served in a lower precision, from its tier.

    - ``max_abs_diff``: the tier's worst-token log-prob bound, on logits: a logit error moves
      log-softmax by up to twice its size, and error common to a row cancels there.
    - ``kl_max``: 10x the tier's mean per-token KL (``k3_kl``) for the worst position.
    - ``tv_max``: Pinsker's bound ``sqrt(KL / 2)`` at that KL.
    - ``argmax_disagreement`` and ``topk_overlap_min`` are reported, not judged: rounding at
      this precision reorders near-ties, and KL and TV already bound the distribution's change
      (generation_parity judges greedy flips, excusing near-ties by their margin).
    """
    kl = 10 * tier["k3_kl"]
    return {
        "max_abs_diff": tier["delta_max_abs"],
        "kl_max": kl,
        "tv_max": (kl / 2) ** 0.5,
        "argmax_disagreement": None,
        "topk_overlap_min": None,
    }


def gaussian_thresholds(tier: Mapping[str, float]) -> dict[str, float]:
    """``logits_agreement``'s Gaussian-policy thresholds for an artifact of a lower precision,
    from its tier (the fp32 defaults' derivations, with the tier's numbers).

    - ``action_max_abs_diff`` and ``std_max_abs_diff``: the mean's budget, the tier's
      ``max_abs_diff`` (:func:`logits_thresholds`), as at fp32.
    - ``gaussian_kl_max``: the tier's ``kl_max`` (10x its mean per-token KL ``k3_kl``).
    - ``logprob_delta_max_abs``: the tier's worst-token log-prob bound ``delta_max_abs``: a
      sampled action's log-prob is judged like a token's.
    """
    logits = logits_thresholds(tier)
    budget = float(logits["max_abs_diff"] or 0.0)
    return {
        "action_max_abs_diff": budget,
        "std_max_abs_diff": budget,
        "gaussian_kl_max": float(logits["kl_max"] or 0.0),
        "logprob_delta_max_abs": tier["delta_max_abs"],
    }


def tier_limits(tier: Mapping[str, float]) -> dict[str, float | None]:
    """Every limit a precision tier sets, by the name each check reads it under: the one table
    behind every comparison of a copy served at a declared precision.

    - ``delta_*``, ``ratio_outside_frac``, ``k3_kl``: ``logprob_delta``'s token log-prob bounds
      (the tier itself).
    - ``max_abs_diff``, ``kl_max``, ``tv_max``, ``argmax_disagreement``, ``topk_overlap_min``:
      ``logits_agreement`` (:func:`logits_thresholds`).
    - ``action_max_abs_diff``, ``std_max_abs_diff``, ``gaussian_kl_max``,
      ``logprob_delta_max_abs``: a Gaussian policy's limits (:func:`gaussian_thresholds`).
    - ``near_tie_margin``: the top-2 logit margin under which ``generation_parity`` and a
      discrete ``rollout_parity`` excuse a greedy flip: the tier's logit bound
      ``max_abs_diff``. ``logits_agreement`` accepts logit errors up to that size, and an error
      that size on the top logit alone can reorder two logits that close.
    - ``action_tolerance``: ``rollout_parity``'s continuous per-step action difference: the
      mean's budget ``action_max_abs_diff`` (an action is the Gaussian's mean).
    - ``return_tolerance`` (relative) and ``max_observation_abs_diff``: what agreeing actions
      may compound into over an episode, 1x and 10x the action tolerance, the ratios of
      ``rollout_parity``'s fp32 defaults (1e-4, 1e-3 against 1e-4).
    """
    logits = logits_thresholds(tier)
    gauss = gaussian_thresholds(tier)
    return {
        **{k: float(v) for k, v in tier.items()},
        **logits,
        **gauss,
        "near_tie_margin": logits["max_abs_diff"],
        "action_tolerance": gauss["action_max_abs_diff"],
        "return_tolerance": gauss["action_max_abs_diff"],
        "max_observation_abs_diff": 10 * gauss["action_max_abs_diff"],
    }


def resolve_tier(
    pinned: str | None, training_dtype: str, served_dtype: str
) -> tuple[str, dict[str, float]]:
    """The tier a served copy is judged by: the pinned key (``causal_lm.precision_tier``),
    else the tier of (training dtype, served dtype) (:func:`tier_for`). Raises ``ValueError``
    for an unknown pinned key or a pair with no tier."""
    if pinned:
        if pinned not in PRECISION_TIERS:
            raise ValueError(
                f"unknown precision tier {pinned!r}; known: {', '.join(PRECISION_TIERS)}")
        return pinned, dict(PRECISION_TIERS[pinned])
    return tier_for(training_dtype, served_dtype)


@dataclass(frozen=True)
class Limits(Mapping[str, "float | None"]):
    """A check's limits for a served copy, each with where it came from.

    ``sources[name]`` is ``"config"`` (the user set it: it wins), ``"tier"`` (the declared
    precision's tier) or ``"default"`` (the check's fp32 default). Built only by
    :func:`judged_limits`.
    """

    by_name: Mapping[str, float | None]
    sources: Mapping[str, str]
    defaults: Mapping[str, float | None]
    tier: str | None = None
    """The tier key whose limits apply (``None``: no tier, the fp32 defaults)."""
    declared_by: str = ""
    """What declares the precision (``causal_lm.serving.dtype bfloat16``)."""

    def __getitem__(self, name: str) -> float | None:
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def source(self, name: str) -> str:
        """Where ``name``'s limit comes from, for a message: ``bf16/fp32 tier; default 0.001
        for fp32``, ``set in the config``; empty for an fp32 default with no tier."""
        how = self.sources.get(name, "default")
        if how == "config":
            return "set in the config"
        if how == "tier":
            default = self.defaults.get(name)
            shown = "not judged" if default is None else f"{default:.3g}"
            return f"{self.tier} tier; default {shown} for fp32"
        return "" if self.tier is None else "fp32 default; the tier sets no such limit"

    def describe(self, name: str) -> str:
        """``0.354 (bf16/fp32 tier; default 0.001 for fp32)``: the limit and its source."""
        value = self.by_name.get(name)
        shown = "not judged" if value is None else f"{value:.3g}"
        source = self.source(name)
        return f"{shown} ({source})" if source else shown

    def note(self, names: Sequence[str] | None = None) -> str | None:
        """One line naming the tier and every limit it set (and the ones the config kept),
        ``None`` when no tier applies."""
        if self.tier is None:
            return None
        shown = [n for n in (names if names is not None else list(self.by_name))
                 if n in self.by_name]
        tiered = [n for n in shown if self.sources.get(n) == "tier"]
        kept = [n for n in shown if self.sources.get(n) == "config"]
        text = (f"limits from the {self.tier} precision tier ({self.declared_by}, see "
                "paritygate.metrics.tiers): "
                + ", ".join(f"{n} {self.describe(n)}" for n in tiered))
        if kept:
            text += "; set in the config, so not from the tier: " + ", ".join(
                f"{n} {self.describe(n)}" for n in kept)
        return text


def judged_limits(
    tier: tuple[str, Mapping[str, float]] | None,
    defaults: Mapping[str, float | None],
    user_set: Collection[str] = (),
    *,
    names: Collection[str] | None = None,
    aliases: Mapping[str, str] | None = None,
    declared_by: str = "",
) -> Limits:
    """The one rule for a copy served at a declared precision: each limit in ``defaults`` is
    the user's value where the config sets it (``user_set``), else the tier's
    (:func:`tier_limits`), else the fp32 default.

    ``tier`` is ``(key, values)`` or ``None`` (fp32, no tier); the ``fp32/fp32`` tier is the
    defaults themselves. ``names`` limits which defaults the tier may replace (all by
    default); ``aliases`` maps a check's own name to the tier limit it takes
    (``eval_max_abs_diff`` -> ``max_abs_diff``).
    """
    key = None if tier is None or tier[0] == "fp32/fp32" else tier[0]
    table = tier_limits(tier[1]) if tier is not None and key is not None else {}
    alias = dict(aliases or {})
    values: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for name, default in defaults.items():
        tier_name = alias.get(name, name)
        if name in user_set:
            values[name], sources[name] = default, "config"
        elif table and (names is None or name in names) and tier_name in table:
            values[name], sources[name] = table[tier_name], "tier"
        else:
            values[name], sources[name] = default, "default"
    return Limits(values, sources, dict(defaults), key, declared_by)


LOGITS_LIMITS = ("kl_max", "tv_max", "argmax_disagreement", "topk_overlap_min")
"""``logits_agreement``'s distribution limits, each replaced by a precision tier's own."""

GAUSSIAN_LIMITS = ("action_max_abs_diff", "std_max_abs_diff", "gaussian_kl_max",
                   "logprob_delta_max_abs")
"""A Gaussian policy's limits, each replaced by a precision tier's own."""

Judge = Callable[[Mapping[str, "float | None"], Collection[str], Collection[str]], Limits]
"""``(defaults, user_set, names) -> Limits``: :func:`judged_limits` with a family's tier and
what declares it bound in (the policy artifact's dtype, the LM engine's dtype)."""


def tier_thresholds(
    judge: Judge,
    thresholds: Mapping[str, float | None],
    user_set: Collection[str],
    *,
    output_keys: Sequence[str] = ("max_abs_diff",),
    extra: Sequence[str] = (),
    shown: Sequence[str] | None = None,
) -> tuple[Limits, str | None]:
    """The one rule for a check's thresholds at a declared precision: the tier replaces the
    defaults unless the config set the value (``user_set``). The output limits in
    ``output_keys`` take the tier's ``max_abs_diff``; :data:`LOGITS_LIMITS` and ``extra``
    take the tier's own. Returns the limits and the note naming the tier for the limits in
    ``shown`` (default: every judged one) that the check has (``None`` without a tier)."""
    judged = [*output_keys, *LOGITS_LIMITS, *extra]
    limits = judge(dict(thresholds), user_set, judged)
    names = judged if shown is None else shown
    return limits, limits.note([n for n in names if n in thresholds])
