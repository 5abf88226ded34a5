"""vllm_delta: logprob_delta with vLLM as the inference engine (needs a CUDA device).

Skipped, with the reason, where no CUDA device is visible or vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from paritygate.check import CheckSpec, Thresholds
from paritygate.checks.logprob_delta import KINDS
from paritygate.metrics.tiers import PRECISION_TIERS
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext

# Same sources as logprob_delta: the strictest tier, replaced by the configured dtypes' tier.
DEFAULTS: dict[str, float] = {**PRECISION_TIERS["fp32/fp32"], "nonfinite_tokens": 0.0}


def unavailable_reason() -> str | None:
    """Why vLLM cannot run here, or ``None``."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'paritygate[vllm]')"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    return None


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.checks.logprob_delta import measure_delta

    reason = unavailable_reason()
    if reason is not None:
        return Measurement("vllm_delta").skip(f"vllm_delta needs vLLM on a GPU: {reason}")
    return measure_delta(ctx, "vllm_delta", thresholds, "vllm")


CHECK = CheckSpec(
    id="vllm_delta",
    summary="vLLM token log-probs match the trainer's teacher-forced recompute",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("gpu",),
    kinds=KINDS,
)
