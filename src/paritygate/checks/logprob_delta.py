"""logprob_delta: the inference engine's token log-probs match the trainer's recompute.

The configured engine (HF ``generate`` with a KV cache on CPU) samples continuations
of the probe prompts under the serving sampling config and reports each token's
log-prob; the trainer's own log-prob function recomputes them teacher-forced.
Thresholds come from the precision tier of (training dtype, engine dtype), see
:mod:`paritygate.lm.tiers`; a value set under ``thresholds.logprob_delta`` overrides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paritygate.check import CheckSpec
from paritygate.lm.tiers import PRECISION_TIERS
from paritygate.result import Measurement

# Defaults are the strictest tier (fp32/fp32, sources in paritygate.lm.tiers); at run time
# the tier of the configured dtypes replaces them unless the config overrides a value.
DEFAULTS: dict[str, float] = {
    **PRECISION_TIERS["fp32/fp32"],
    # A NaN/Inf log-prob is never acceptable (DESIGN: NaN fails by name).
    "nonfinite_tokens": 0.0,
}


def measure(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    from paritygate.lm.recompute import measure_delta

    engine = next((e for e in ctx.spec.engines if e != "vllm"), None)
    if engine is None:
        return Measurement("logprob_delta").skip("no CPU engine configured (engines: vllm only)")
    return measure_delta(ctx, "logprob_delta", thresholds, engine)


CHECK = CheckSpec(
    id="logprob_delta",
    summary="engine token log-probs match the trainer's teacher-forced recompute",
    families=("causal_lm",),
    measure=measure,
    defaults=DEFAULTS,
    marks=("fast",),
)
