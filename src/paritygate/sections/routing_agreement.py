"""``routing_agreement``'s block: ``causal_lm.routing``."""

from __future__ import annotations

from pydantic import Field

from paritygate.sections import Section


class RoutingSpec(Section):
    """``routing_agreement``: the experts a mixture-of-experts policy's engine routes each token
    to, against the trainer's. The block's presence says the model is an MoE: a model without
    MoE layers is then bad input, not a skip."""

    FAMILY = "causal_lm"
    KEY = "routing"
    FIELD_DOC = ("``routing_agreement``'s settings (an MoE policy); without the block a dense "
                 "model skips the check.")

    samples: bool = False
    """Also teacher-force the HF engine's sampled completions (``generation_samples`` per
    probe; one generation more unless ``logprob_delta`` already sampled them)."""
    dump_experts: bool = False
    """Every record of ``engine.dump`` must carry ``routed_experts``: the experts the engine
    routed each token to, audited against the trainer's recompute."""
    tie_margin: float | None = Field(None, gt=0, lt=1)
    """Relative router margin under which a flipped expert set is a near tie (default: the
    precision tier's, :data:`paritygate.metrics.routing.ROUTER_TIE_REL`)."""


SECTION = RoutingSpec
