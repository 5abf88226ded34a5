"""``reference_parity``'s block: ``causal_lm.reference``."""

from __future__ import annotations

from typing import Literal

from paritygate.config_base import ConfigPath, Dtype
from paritygate.sections import Section


class ReferenceSpec(Section):
    """The KL reference model of the RL loop (``reference_parity``)."""

    FAMILY = "causal_lm"
    KEY = "reference"
    FIELD_DOC = "The KL reference model (``reference_parity``; skipped when absent)."

    model_dir: ConfigPath
    """The reference model's HF directory, as the trainer loads it."""
    initial: str
    """The initial policy the reference must equal: its HF directory, or a sha256 recorded at
    the start of training (``sha256sum model.safetensors``, or the tensor digest
    ``paritygate.families.causal_lm.reference:state_digest`` prints)."""
    logprob_fn: str | None = None
    """The trainer's reference log-prob function (default: ``training.logprob_fn``)."""
    logprob_convention: Literal["auto", "model", "logits"] = "auto"
    kl_estimator: str = "k3"
    """``k1``, ``k2``, ``k3`` or ``module:callable`` called as ``f(logp, logp_ref, mask)``
    (each ``(B, T)``, ``mask`` 1 on real tokens) returning either the per-token KL term
    ``(B, T)`` (TRL GRPO's ``per_token_kl``: ``exp(ref - logp) - (ref - logp) - 1``) or one
    value per sequence ``(B,)``, reduced over the mask as ``kl_reduction`` says."""
    kl_reduction: Literal["mean", "sum"] = "mean"
    """How a per-sequence estimator reduces its per-token terms: ``mean`` (masked mean,
    ``sum(k * mask, -1) / sum(mask, -1)``, as TRL and verl do) or ``sum``
    (``sum(k * mask, -1)``). Not read for a per-token estimator."""
    dtype: Dtype | None = None
    """The dtype the reference is stored in, when lower than the initial policy's (declared:
    its tensors must be the initial ones cast exactly)."""


SECTION = ReferenceSpec
