"""vllm_delta: logprob_delta with vLLM as the inference engine (CPU or CUDA, as vLLM reports).

Runs only when asked for: the config's ``causal_lm.engines`` lists ``vllm`` (or
``serving.engine: vllm``), its ``checks:`` names ``vllm_delta``, or the run selects it
(``-m vllm``, ``--check vllm_delta``); otherwise it is skipped saying so, since starting vLLM
costs minutes on CPU. Skipped, with vLLM's reason, where vLLM cannot serve the engine's model:
not installed, not importing, no platform it runs on, or (on CPU) a head size its attention
kernels lack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paritygate.causes import Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks.logprob_delta import KINDS
from paritygate.metrics.tiers import PRECISION_TIERS
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext

# Same sources as logprob_delta: the strictest tier, replaced by the configured dtypes' tier.
DEFAULTS: dict[str, float] = {**PRECISION_TIERS["fp32/fp32"], "nonfinite_tokens": 0.0}


def unavailable_reason(model_dir: Any = None) -> str | None:
    """Why vLLM cannot serve ``model_dir`` here, or ``None``."""
    from paritygate.engines.vllm_engine import vllm_unavailable_reason

    return vllm_unavailable_reason(model_dir)


def unasked(ctx: LMContext) -> str | None:
    """Why the config does not ask for vLLM (``None``: its engines list it)."""
    if "vllm" in ctx.spec.engines:
        return None
    return (
        f"vllm_delta runs when the config asks for vLLM: causal_lm.engines is "
        f"[{', '.join(ctx.spec.engines)}] (add vllm to it, or select the check with -m vllm)"
    )


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    from paritygate.checks.logprob_delta import measure_delta

    reason = unavailable_reason(ctx.serving.model_dir)
    if reason is not None:
        return Measurement("vllm_delta").skip(f"vllm_delta needs vLLM: {reason}")
    m = measure_delta(ctx, "vllm_delta", thresholds, "vllm")
    if ctx.engines.vllm_model_dir() != ctx.serving.model_dir:
        m.note(
            f"vLLM serves a copy of {ctx.serving.model_dir} without the training-only heads "
            f"{list(ctx.spec.training_only_heads)} (vLLM refuses parameters its model class "
            "lacks; paritygate export writes the same copy)"
        )
    return m


CHECK = CheckSpec(
    id="vllm_delta",
    summary="vLLM token log-probs match the trainer's teacher-forced recompute",
    measures={"causal_lm": measure},
    downstream=True,
    defaults=DEFAULTS,
    # `vllm`: needs vLLM (its CPU build or CUDA); `gpu` is the earlier name, still selected.
    marks=("vllm", "gpu"),
    kinds=KINDS,
    unasked=unasked,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("vllm_delta", "penalty_applied", ("penalty_applied",), ("behaviour_parity",),
                "vLLM lowers the log-probs of tokens already in the context (a penalty) "
                "where the trainer's recompute does not",
                fix="serve without the penalty (repetition_penalty 1, presence_penalty and "
                    "frequency_penalty 0), or apply it in causal_lm.training.logprob_fn and "
                    "declare it in causal_lm.training.logprob_applies",
                rank=326),
)

POSITION = 140
"""The check's place in the checklist (and in every report): the registry sorts by it."""
