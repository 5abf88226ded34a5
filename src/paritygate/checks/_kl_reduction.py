"""How a per-sequence KL estimator reduces its per-token terms, for ``reference_parity``.

A trainer's estimator returning one value per sequence (TRL, verl: the masked mean) is called
on the probes in the trainer's layout, with the real log-probs at pad positions too (a trainer
computes them; only the mask removes them). Its output is matched against each reduction of
its own per-token terms: the masked mean and masked sum (what a correct trainer returns), the
mean and sum over every position (the mask not applied: pads counted) and the masked sum over
every position's count (a mean over pads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.records import Record

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.families.causal_lm.reference import ReferenceSetup
    from paritygate.result import Measurement

REDUCTION_RTOL = 1e-6
"""Relative tolerance to take an output as one reduction: float64 sums of ~100 terms agree to
~1e-15; a float32 estimator to ~1e-7."""

KINDS = {
    "pads_counted_mean": "kl_mask_ignored", "pads_counted_sum": "kl_mask_ignored",
    "mean_over_pads": "kl_mean_over_pads",
}


@dataclass(frozen=True)
class Reduction(Record):
    """The KL function's output (per sequence) and the reduction it was recognised as."""

    kl_output: str
    kl_reduction: str


def reductions(terms: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Each way of reducing ``terms`` ``(B, T)`` over ``mask`` ``(B, T)``, ``(B,)`` each."""
    kept = (terms * mask).sum(-1)
    return {"mean": kept / mask.sum(-1).clamp(min=1), "sum": kept,
            "pads_counted_mean": terms.mean(-1), "pads_counted_sum": terms.sum(-1),
            "mean_over_pads": kept / terms.shape[-1]}


def judge_reduction(m: Measurement, setup: ReferenceSetup, logp: Tensor, logp_ref: Tensor,
                    mask: Tensor) -> None:
    """The per-sequence estimator on ``(B, T)`` log-probs against each reduction of its own
    terms; a reduction other than ``kl_reduction`` is named."""
    import torch

    with torch.inference_mode():
        out = setup.kl_fn(logp, logp_ref, mask.to(logp.dtype))
    if not hasattr(out, "shape") or tuple(out.shape) != (logp.shape[0],):
        shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
        m.fail("kl_estimator_shape",
               f"the KL estimator {setup.kl_name} returns {shape} for {tuple(logp.shape)} "
               f"log-probs; it returned one value per sequence when the gate probed it")
        return
    out = out.double()
    if not bool(torch.isfinite(out).all()):
        m.fail("kl_reduction_wrong", f"the KL estimator {setup.kl_name} returns NaN/Inf per "
               "sequence on the probes", metric="kl_reduction_max_abs")
        return
    terms = setup.kl_terms(logp, logp_ref).double()  # (B, T)
    found = reductions(terms, mask.double())
    errors = {name: float((out - value).abs().max() / max(1.0, float(value.abs().max())))
              for name, value in found.items()}
    nearest = min(errors, key=lambda k: errors[k])
    declared = setup.kl_reduction
    m.record(Reduction("sequence", nearest if errors[nearest] <= REDUCTION_RTOL
                       else "unrecognised"))
    m.metric("kl_reduction_max_abs", errors[declared], threshold=REDUCTION_RTOL, ratchet=False)
    m.metric("kl_estimate_mean", float(out.mean()), bad="none", ratchet=False)
    if errors[declared] <= REDUCTION_RTOL:
        return
    pads = int((mask == 0).sum())
    truth = float(found[declared].mean())
    said = f"{float(out.mean()):.3g} vs {truth:.3g} nats per sequence on average"
    if errors[nearest] > REDUCTION_RTOL:
        m.fail("kl_reduction_wrong",
               f"the KL estimator {setup.kl_name} returns per sequence none of the masked "
               f"mean, the masked sum, or either over every position of its own per-token "
               f"terms ({said} for the masked {declared})", metric="kl_reduction_max_abs")
    elif nearest in ("mean", "sum"):
        m.fail("kl_reduction_differs",
               f"the KL estimator {setup.kl_name} returns the masked {nearest} per sequence "
               f"({said}), causal_lm.reference.kl_reduction declares {declared}: the KL "
               f"coefficient acts {'per token' if declared == 'mean' else 'per sequence'} in "
               f"the trainer's loss; set kl_reduction: {nearest} if the trainer reduces so",
               metric="kl_reduction_max_abs")
    elif KINDS[nearest] == "kl_mask_ignored":
        m.fail("kl_mask_ignored",
               f"the KL estimator {setup.kl_name} ignores the mask: its per-sequence "
               f"{nearest.rsplit('_', 1)[1]} counts the {pads} pad positions of the probes "
               f"({said} for the masked {declared}); multiply the terms by the mask",
               metric="kl_reduction_max_abs")
    else:
        m.fail("kl_mean_over_pads",
               f"the KL estimator {setup.kl_name} divides its masked sum by every position, "
               f"pads included ({said} for the masked mean): divide by mask.sum(-1)",
               metric="kl_reduction_max_abs")
