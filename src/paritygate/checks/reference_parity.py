"""reference_parity: the KL reference is the frozen initial policy, scored the trainer's way.

Reads ``causal_lm.reference`` (skipped when absent) and proves, on the probes laid out as the
trainer batches them (prompts left-padded, completions right-padded after EOS):

- the reference's tensors equal the initial policy's, bitwise (a declared ``dtype``: the exact
  cast), or its digest equals the sha256 recorded at the start of training;
- it is not the policy under test (same files, or a KL identically 0 on every token);
- its log-probs under the trainer's function equal the gate's recompute (the ``logprob_impl``
  semantics: position t scores token t+1, pads score 0, the mask and positions applied);
- the trainer's KL estimator, evaluated on every token of the policy's next-token distributions,
  has the exact KL(policy || reference) as its expectation: a flipped sign, swapped arguments
  or another form is named;
- the reference's tensor digest (``reference_digest``) is a golden metric that must not change:
  a reference that moved between two checkpoints of one policy is ``reference_drift``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paritygate.causes import Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._kl_reduction import judge_reduction
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.causal_lm.reference import ReferenceSetup

LIBRARY_FN = "paritygate.families.causal_lm.logprobs:compute_logprobs"

DEFAULTS: dict[str, float] = {
    # Bitwise: a reference is the initial policy's tensors or it is another model.
    "tensors_differ_from_initial": 0.0,
    # The trainer's function and the gate's recompute run one forward of one model: fp32
    # reduction order, the fp32/fp32 tier's delta_max_abs (paritygate.metrics.tiers). Rotary
    # models called without position ids stay within it (1.4e-5 on the demo LM).
    "reference_logprobs_max_abs": 1e-4,
    # A target that is a pad contributes exactly nothing to the KL term.
    "reference_pads_scored": 0.0,
    # E_pi[estimator] - KL(pi || pi_ref) per token: k1 and k3 are exact in expectation, so
    # the error is fp32 rounding of a sum over the vocabulary (~1e-7); 1e-4 as above.
    "kl_estimator_max_abs": 1e-4,
}

LOGPROB_METRIC = "reference_logprobs_max_abs"
"""Judged by the declared reference dtype's tier (``<dtype>/<dtype>``'s ``delta_max_abs``)
when the reference runs in a lower precision: two functions over one bf16 forward differ by
that forward's rounding where they lay out positions differently."""

FORM_TOLERANCE = 1e-4
"""Probability-weighted mean abs difference under which an estimator is taken to be a form."""


@dataclass(frozen=True)
class ReferenceDigest(Record):
    """The reference's tensor digest and its files' sha256 (held in golden across
    checkpoints)."""

    reference_digest_sha256: str
    reference_files_sha256: str


@dataclass(frozen=True)
class InitialComparison(Record):
    """The reference's tensors against the initial policy's (ten of each kind at most)."""

    compared: int
    missing: list[str]
    extra: list[str]
    shape: dict[str, object]
    value_diffs: dict[str, float]
    """Tensor name -> max abs difference, largest first."""
    dtype_changes: int
    cast_exact: int


@dataclass(frozen=True)
class InitialRecord(Record):
    initial_comparison: InitialComparison


@dataclass(frozen=True)
class LogprobFunction(Record):
    """The trainer's reference log-prob function."""

    logprob_fn: str


@dataclass(frozen=True)
class ReferenceTier(Record):
    """The precision tier of a reference declared in low precision."""

    reference_tier: str


@dataclass(frozen=True)
class Estimator(Record):
    """The trainer's KL estimator and the reference's dtype."""

    kl_estimator: str
    reference_dtype: str


@dataclass(frozen=True)
class EstimatorForm(Record):
    """The estimator form (k1, k2, k3, ...) the trainer's per-token KL was recognised as."""

    kl_form: str


def _weighted_gap(p: Any, est: Any, form: Any) -> float:
    """max over positions of sum_v p(v) |est(v) - form(v)| (equal entries count 0, infs too)."""
    import torch

    gap = torch.where(est == form, torch.zeros_like(est), (est - form).abs())
    return float(torch.nan_to_num((p * gap).sum(-1), nan=float("inf")).max())


def _provenance(
    m: Measurement, ctx: LMContext, setup: ReferenceSetup, thresholds: Mapping[str, float]
) -> None:
    """Tensors vs the initial policy (or its recorded sha256), and the reference's digest."""
    state = setup.state()
    digest = setup.digest(state)
    m.metric("reference_digest", int(digest[:13], 16), bad="change")
    m.record(ReferenceDigest(digest, setup.files_sha256))
    diff = setup.compare_with_initial(state, list(ctx.spec.training_only_heads),
                                      tied_in=ctx.training.model())
    if diff is None:
        same = setup.initial_sha256 in (digest, setup.files_sha256)
        m.metric("tensors_differ_from_initial", 0 if same else len(state),
                 threshold=thresholds["tensors_differ_from_initial"])
        if not same:
            m.fail("reference_not_initial",
                   f"the reference's sha256 ({setup.files_sha256[:12]}, tensor digest "
                   f"{digest[:12]}) is not the initial policy's recorded "
                   f"{str(setup.initial_sha256)[:12]}: a reference from another step",
                   metric="tensors_differ_from_initial")
        return
    declared = setup.dtype
    lowered = sorted(diff.served_dtypes())
    differ = (len(diff.missing) + len(diff.extra) + len(diff.shape) + len(diff.value_diffs)
              + len([k for k in diff.cast_exact if not declared]))
    m.metric("tensors_differ_from_initial", differ,
             threshold=thresholds["tensors_differ_from_initial"], key=True)
    m.record(InitialRecord(InitialComparison(
        diff.compared, diff.missing[:10], diff.extra[:10], dict(list(diff.shape.items())[:10]),
        dict(sorted(diff.value_diffs.items(), key=lambda kv: -kv[1])[:10]),
        len(diff.dtype_changes), len(diff.cast_exact))))
    if diff.nonfinite:
        m.fail("nonfinite_reference",
               f"the reference holds NaN/Inf in {len(diff.nonfinite)} tensors "
               f"({diff.nonfinite[0]})")
    if diff.missing or diff.extra or diff.shape or diff.value_diffs:
        worst = max(diff.value_diffs.items(), key=lambda kv: kv[1], default=None)
        parts = []
        if diff.value_diffs and worst is not None:
            parts.append(f"{len(diff.value_diffs)} of {diff.compared} tensors differ (max abs "
                         f"{worst[1]:.3g} in {worst[0]})")
        if diff.missing:
            parts.append(f"{len(diff.missing)} missing ({diff.missing[0]})")
        if diff.extra:
            parts.append(f"{len(diff.extra)} extra ({diff.extra[0]})")
        if diff.shape:
            parts.append(f"{len(diff.shape)} reshaped ({next(iter(diff.shape))})")
        m.fail("reference_not_initial",
               f"the reference is not the initial policy: {'; '.join(parts)}: a reference "
               "saved at another step, or one that kept training",
               metric="tensors_differ_from_initial")
    elif lowered and not declared:
        m.fail("reference_precision_undeclared",
               f"the reference stores {len(diff.cast_exact)} tensors in {', '.join(lowered)}, "
               "each exactly the initial policy's cast: a precision change the config does not "
               "declare (causal_lm.reference.dtype)",
               metric="tensors_differ_from_initial")
    elif declared and not lowered:
        m.note(f"causal_lm.reference.dtype declares {declared}; the reference stores the "
               "initial policy's full-precision tensors")


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    import torch

    m = Measurement("reference_parity")
    setup = ctx.kl_reference
    if setup is None:
        return m.skip("no causal_lm.reference block: the KL reference is not gated")
    seqs = [s for s in ctx.training.prompts if len(s) >= 2]
    if not seqs:
        return m.skip("no probe prompt has two or more tokens")
    _provenance(m, ctx, setup, thresholds)
    same_files = setup.files_sha256 == ctx.checkpoint_sha256

    tok = ctx.training.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = tok.eos_token_id if tok.eos_token_id is not None else pad
    helpers = ctx.logprobs.helpers
    ids, mask = setup.rl_layout(seqs, pad, eos)  # (B, T)
    keep = helpers.target_mask(mask)  # (B, T-1)
    ref_model = setup.model()
    ref_logits = helpers.model_logits(ref_model, ids, mask)  # (B, T, V)
    pol_logits = helpers.model_logits(ctx.training.model(), ids, mask)  # (B, T, V)
    nonfinite = [side for side, logits in (("reference", ref_logits), ("policy", pol_logits))
                 if not bool(torch.isfinite(logits[:, :-1][keep]).all())]
    if nonfinite:
        m.fail("nonfinite_reference", f"non-finite logits from the {' and '.join(nonfinite)} "
               "model: no KL can be measured")
        return m
    gate_lp = helpers.logprobs_from_logits(ref_logits, ids, mask)  # (B, T-1)

    # -- the trainer's reference log-probs vs the gate's recompute --------------------------
    m.record(LogprobFunction(setup.logprob_fn_name))
    if setup.logprob_fn_name == LIBRARY_FN:
        m.note("the trainer's reference log-prob function is the gate's own compute_logprobs")
        m.metric("reference_logprobs_max_abs", 0.0,
                 threshold=thresholds["reference_logprobs_max_abs"])
    else:
        out = setup.logprob_fn(ref_model, ids, mask, mode="raw")
        limits = dict(thresholds)
        if setup.dtype not in (None, "float32") and not thresholds.is_set(LOGPROB_METRIC):
            from paritygate.metrics.tiers import tier_for

            tier, bounds = tier_for(setup.dtype, setup.dtype)
            limits[LOGPROB_METRIC] = bounds["delta_max_abs"]
            m.record(ReferenceTier(tier))
        _judge_logprobs(m, setup, out, gate_lp, ids, mask, keep, limits)

    # -- exact KL(policy || reference) per token and the estimator --------------------------
    # float64: exp(logp_ref - logp) of a near-impossible token overflows float32 (r > 88)
    logp_full = torch.log_softmax(pol_logits[:, :-1].double(), dim=-1)  # (B, T-1, V)
    logq_full = torch.log_softmax(ref_logits[:, :-1].double(), dim=-1)  # (B, T-1, V)
    logp_all, logq_all = logp_full[keep], logq_full[keep]  # (N, V)
    p = logp_all.exp()
    kl_exact = (p * (logp_all - logq_all)).sum(-1)  # (N,)
    m.metric("kl_exact_mean", float(kl_exact.mean()), bad="none", ratchet=False)
    m.metric("kl_exact_max", float(kl_exact.abs().max()), bad="none", ratchet=False)
    m.metric("tokens", int(keep.sum()), bad="none", ratchet=False)
    if same_files or float(kl_exact.abs().max()) == 0.0:
        why = ("its files are the checkpoint under test's" if same_files
               else f"KL(policy || reference) is exactly 0 on all {int(keep.sum())} tokens")
        m.fail("reference_is_policy",
               f"the KL reference is the policy under test ({why}): the KL term is "
               "identically 0 and constrains nothing; point causal_lm.reference.model_dir "
               "at the frozen initial policy")
    _judge_estimator(m, setup, p, logp_all, logq_all, kl_exact, thresholds)
    targets = ids[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    lp_seq = logp_full.gather(-1, targets).squeeze(-1)  # (B, T-1), pads' real log-probs too
    lq_seq = logq_full.gather(-1, targets).squeeze(-1)
    if setup.kl_output == "sequence":
        judge_reduction(m, setup, lp_seq, lq_seq, keep)
    else:
        sampled = setup.kl_terms(lp_seq[keep], lq_seq[keep])  # (N,)
        if tuple(sampled.shape) == (int(keep.sum()),):
            m.metric("kl_estimate_mean", float(sampled.float().mean()), bad="none",
                     ratchet=False)
    m.record(Estimator(setup.kl_name, setup.dtype or "as the initial policy"))
    return m


def _judge_logprobs(
    m: Measurement, setup: ReferenceSetup, out: Any, gate_lp: Any, ids: Any, mask: Any,
    keep: Any, thresholds: Mapping[str, float],
) -> None:
    """The trainer's reference log-probs against the gate's; an unmasked forward is named."""
    import torch

    expected = tuple(gate_lp.shape)
    if not hasattr(out, "shape") or tuple(out.shape) != expected:
        shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
        m.fail("reference_logprobs_shape",
               f"the reference log-prob function returns {shape} for a {tuple(ids.shape)} "
               f"batch; expected {expected}: position t scores token t+1")
        return
    out = out.detach().float()
    if not bool(torch.isfinite(out[keep]).all()):
        m.fail("nonfinite_reference", "the reference log-prob function returns NaN/Inf")
        return
    err = float((out - gate_lp)[keep].abs().max())
    pads = int((out[mask[:, 1:] == 0] != 0).sum())
    m.metric("reference_logprobs_max_abs", err, threshold=thresholds["reference_logprobs_max_abs"],
             ratchet=False)
    m.metric("reference_pads_scored", pads, threshold=thresholds["reference_pads_scored"])
    if err <= thresholds["reference_logprobs_max_abs"] and not pads:
        return
    with torch.inference_mode():
        bare = setup.model()(input_ids=ids).logits.float()  # (B, T, V): no mask, no positions
    alt = float((out - setup.maskless_logprobs(bare, ids))[mask[:, 1:] == 1].abs().max())
    if alt * 10 < max(err, 1e-12) or (pads and alt <= thresholds["reference_logprobs_max_abs"]):
        m.fail("reference_mask_ignored",
               f"reference log-probs computed without the attention mask: left pads are "
               f"attended (real tokens move by up to {err:.3g}) and {pads} pad targets are "
               "scored; pass attention_mask (and position_ids) to the reference forward and "
               "zero the pad positions", metric="reference_logprobs_max_abs")
    elif pads:
        m.fail("reference_pads_scored",
               f"{pads} positions whose target is a pad have nonzero reference log-probs",
               metric="reference_pads_scored")
    else:
        m.fail("reference_logprobs_differ",
               f"the trainer's reference log-probs differ from the gate's recompute by up to "
               f"{err:.3g} on real tokens", metric="reference_logprobs_max_abs")


def _judge_estimator(
    m: Measurement, setup: ReferenceSetup, p: Any, lp: Any, lq: Any, kl_exact: Any,
    thresholds: Mapping[str, float],
) -> None:
    """The estimator on every vocabulary entry: its form, and its expectation under the
    policy against the exact KL per token."""
    import torch

    est = setup.kl_terms(lp, lq)  # (N, V): a per-sequence estimator one entry at a time
    if not hasattr(est, "shape") or tuple(est.shape) != tuple(lp.shape):
        shape = tuple(est.shape) if hasattr(est, "shape") else type(est).__name__
        m.fail("kl_estimator_shape",
               f"the KL estimator {setup.kl_name} returns {shape} for {tuple(lp.shape)} "
               "log-probs, not the shape it returned when the gate probed it")
        return
    est = est.double()
    forms = setup.estimator_forms(lp, lq)  # name -> (N, V)
    gaps = {name: _weighted_gap(p, est, form) for name, form in forms.items()}
    nearest = min(gaps, key=lambda k: gaps[k])
    form = nearest if gaps[nearest] <= FORM_TOLERANCE else None
    m.record(EstimatorForm(form or "unrecognised"))
    expectation = (p * torch.where(p > 0, est, torch.zeros_like(est))).sum(-1)  # (N,)
    err = float(torch.nan_to_num((expectation - kl_exact).abs(), nan=float("inf")).max())
    biased_by_design = form == "k2" or setup.kl_name == "k2"
    m.metric("kl_estimator_max_abs", err,
             threshold=None if biased_by_design else thresholds["kl_estimator_max_abs"],
             ratchet=False)
    if biased_by_design:
        m.note(f"k2 = (logp - logp_ref)^2 / 2 is biased by design: its expectation differs "
               f"from the exact KL by up to {err:.3g} per token on the probes (reported, not "
               "judged)")
        return
    if form in ("-k1", "-k3", "-k2"):
        mean_est, mean_kl = float(expectation.mean()), float(kl_exact.mean())
        m.fail("kl_sign_flipped",
               f"the KL estimator {setup.kl_name} is {form}: its sign is flipped (the penalty "
               f"rewards moving away from the reference; E[estimate] = {mean_est:.3g} vs the "
               f"exact KL {mean_kl:.3g} per token)",
               metric="kl_estimator_max_abs")
    elif form == "k3_swapped":
        m.fail("kl_arguments_swapped",
               f"the KL estimator {setup.kl_name} is k3 with its arguments swapped "
               "(exp(logp - logp_ref) - (logp - logp_ref) - 1): under samples of the policy it "
               f"does not estimate KL(policy || reference) (error up to {err:.3g} per token); "
               "use r = logp_ref - logp", metric="kl_estimator_max_abs")
    elif err > thresholds["kl_estimator_max_abs"]:
        sign = " and negative on average" if float(expectation.mean()) < 0 else ""
        m.fail("kl_estimator_wrong",
               f"the KL estimator {setup.kl_name} is none of k1, k2, k3: its expectation "
               f"under the policy differs from the exact KL by up to {err:.3g} per "
               f"token{sign} (k3 is exp(r) - r - 1 with r = logp_ref - logp)",
               metric="kl_estimator_max_abs")


CHECK = CheckSpec(
    id="reference_parity",
    summary="KL reference: the frozen initial policy, not the policy, scored the trainer's way",
    measures={"causal_lm": measure},
    needs=("models", "kl_reference"),
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("reference_not_initial", "reference_precision_undeclared", "nonfinite_reference",
           "reference_is_policy", "reference_logprobs_shape", "reference_mask_ignored",
           "reference_pads_scored", "reference_logprobs_differ", "kl_estimator_shape",
           "kl_sign_flipped", "kl_arguments_swapped", "kl_estimator_wrong", "kl_mask_ignored",
           "kl_mean_over_pads", "kl_reduction_differs", "kl_reduction_wrong"),
    feeds_probes=True,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("reference_parity", "reference_drift", (), (),
                "the KL reference changed between two checkpoints of one policy",
                fix="restore the frozen initial policy as the KL reference, then re-bless",
                regressed=("reference_digest",),
                rank=390),
    Explanation("reference_parity", "reference_is_policy", ("reference_is_policy",), (),
                "the KL reference is the policy under test",
                fix="point causal_lm.reference.model_dir at the frozen initial policy",
                rank=400),
    Explanation("reference_parity", "reference_provenance",
                ("reference_not_initial", "reference_precision_undeclared",
                 "nonfinite_reference"), (),
                "the KL reference is not the initial policy's tensors",
                fix="load the KL reference from the initial policy's checkpoint (or declare "
                    "its dtype: causal_lm.reference.dtype)",
                rank=410),
    Explanation("reference_parity", "reference_logprobs",
                ("reference_logprobs_shape", "reference_mask_ignored", "reference_pads_scored",
                 "reference_logprobs_differ"), (),
                "the trainer scores the KL reference differently from the gate's recompute",
                fix="pass attention_mask and position_ids to the reference forward and zero "
                    "pad targets",
                rank=420),
    Explanation("reference_parity", "kl_estimator",
                ("kl_estimator_shape", "kl_sign_flipped", "kl_arguments_swapped",
                 "kl_estimator_wrong"), (),
                "the trainer's KL estimator does not estimate KL(policy || reference)",
                fix="per token, with r = logp_ref - logp: k3 = exp(r) - r - 1 (or k1 = -r)",
                rank=430),
    Explanation("reference_parity", "kl_reduction",
                ("kl_mask_ignored", "kl_mean_over_pads", "kl_reduction_differs",
                 "kl_reduction_wrong"), (),
                "the trainer's per-sequence KL is not its per-token terms reduced over the "
                "mask as declared",
                fix="per sequence: (k * mask).sum(-1) / mask.sum(-1) (or declare "
                    "causal_lm.reference.kl_reduction: sum for (k * mask).sum(-1))",
                rank=435),
)

POSITION = 200
"""The check's place in the checklist (and in every report): the registry sorts by it."""
