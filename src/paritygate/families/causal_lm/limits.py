"""The causal-LM checks' limits for the served copy: one rule for every LM check."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.metrics.tiers import Limits


def served_limits(
    spec: CausalLMSpec, declared_dtype: tuple[str, str] | None,
    defaults: Mapping[str, float | None], user_set: Collection[str],
    names: Collection[str] | None = None,
) -> Limits:
    """The user's values where the config sets them, else the tier of the declared precision
    (``precision_tier``, else training dtype against serving dtype), else the fp32 defaults
    (:func:`paritygate.metrics.tiers.judged_limits`). ``declared_dtype`` is ``(config key,
    dtype)`` when the config states the serving dtype."""
    from paritygate.metrics.tiers import judged_limits, resolve_tier

    try:
        tier = resolve_tier(spec.precision_tier, spec.training.dtype, spec.engine.dtype)
    except ValueError:
        tier = None  # no tier for this pair: the fp32 defaults (or the config's) apply
    if spec.precision_tier:
        by = f"causal_lm.precision_tier {spec.precision_tier}"
    else:
        source = declared_dtype[0] if declared_dtype else "causal_lm.engine.dtype"
        by = f"training {spec.training.dtype}, serving {spec.engine.dtype} from {source}"
    return judged_limits(tier, defaults, user_set, names=names, declared_by=by)
