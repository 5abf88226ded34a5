"""precision_per_layer: fp16/bf16 error per layer is within budget and no worse than golden.

One low-precision pass per dtype with hooks (cumulative error of every layer),
one fp32 pass (local error: each layer rerun alone in low precision on its
fp32 inputs), streamed statistics. Each layer's local relative L2 error is a
per-layer (detail) metric with its budget as threshold, so the golden step
ratchets every layer; the report's metric table holds the headline numbers and
the per-layer rows live in precision.json/CSV, the plot and ``<check>.detail.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from paritygate.check import CheckSpec
from paritygate.precision.report import PrecisionDetails
from paritygate.result import Measurement

if TYPE_CHECKING:

    from paritygate.families.base import Context
    from paritygate.precision.report import DtypeSummary, OnnxReport

CHECK_ID = "precision_per_layer"

DEFAULTS: dict[str, float] = {
    # k_local: a layer's local rel L2 budget is k_local * u (u = unit roundoff of the dtype).
    # Rounding input, weights and output costs ~u/sqrt(3) each; whole transformer blocks
    # measure 1-3 u (test_suites/precision/test_sanity.py); 16 leaves a factor ~5 of headroom.
    "local_budget_ulps": 16.0,
    # k_out: output rel L2 budget is k_out * u * sqrt(D), D = parameterised layer calls;
    # independent per-layer errors of a few u add in quadrature over D layers.
    "output_budget_ulps": 8.0,
    # Largest fp32 activation as a fraction of the dtype's largest finite value: above 1/2
    # a single doubling (a residual add, a larger input) overflows.
    "headroom_max": 0.5,
    # fp32 ONNX artifact vs torch fp32, per tensor: two correct fp32 implementations differ by
    # summation order, 1e-7..1e-6 relative (measured on the zoo policy: <= 2.4e-7); an altered
    # node (epsilon, approximation, scale) shows >= 1e-4.
    "onnx_fp32_rel_l2": 1e-5,
}


def _dtype_findings(m: Measurement, dtype: str, summary: DtypeSummary) -> None:
    first = summary.first_divergent
    mixed = summary.mixed
    fix = ""
    if mixed and mixed.verified and mixed.large:
        fix = (
            f"; only keeping {mixed.keep_fp32} ({100 * mixed.share:.0f}% of the measured "
            f"layers) in fp32 verifies: every smaller set hands {dtype} values beyond its range "
            "to the next module, so the fix is the scale of the first divergent layer's weights "
            "or activations, not mixed precision"
        )
    elif mixed and mixed.verified:
        fix = (
            f"; keeping {mixed.keep_fp32} in fp32 brings the output rel L2 error to "
            f"{float(mixed.output_rel_l2 or 0.0):.3g} (budget {summary.output_budget:.3g}), "
            f"verified by a run with {dtype} hand-offs between modules (kept layers compute in "
            f"fp32 on upcast inputs and hand their outputs on in {dtype}, as a runtime that pins "
            "nodes in fp32 runs them)"
        )
    elif mixed:
        fix = f"; no set of layers kept in fp32 passed within {mixed.runs} verification runs"
    if first is not None:
        m.fail(
            "first_divergent_layer",
            f"{dtype}: first divergent layer {first.layer!r} ({first.type}, "
            f"#{first.index} in execution order): {first.reason}; "
            f"{summary.layers_over_budget} layer(s) over budget{fix}"
        )
    elif fix:
        m.note(f"{dtype}: output over budget with every layer inside its own budget{fix}")
    if summary.output_nan or summary.output_inf:
        m.fail(
            "lowp_nonfinite",
            f"{dtype} output has {summary.output_nan} NaN and {summary.output_inf} Inf "
            "values where the fp32 output is finite"
        )


def _onnx_metrics(m: Measurement, onnx: OnnxReport) -> None:
    if onnx.output_error:
        m.fail("onnx_uncomparable", f"ONNX artifact cannot be compared: {onnx.output_error}")
        return
    m.metric("onnx/output_rel_l2", onnx.output_rel_l2, threshold=onnx.output_budget, ratchet=False)
    m.metric("onnx/layers_compared", len(onnx.rows), bad="none")
    m.metric("onnx/layers_unmapped", len(onnx.unmapped), bad="none")
    for row in onnx.rows:
        m.metric(
            f"onnx/{row.layer}/rel_l2",
            row.onnx_rel_l2,
            threshold=row.budget,
            ratchet=False,
            detail=True,
        )
    if onnx.marking_note:
        m.note(onnx.marking_note)
    first = onnx.first_divergent
    if first is not None:
        value = next(r.onnx_value for r in onnx.rows if r.layer == first.layer)
        m.fail(
            "onnx_divergent_layer",
            f"ONNX artifact ({onnx.dtype}): first divergent layer {first.layer!r} "
            f"(value {value!r}): rel L2 error {first.rel_l2:.3g} "
            f"vs torch fp32 exceeds its budget {first.budget:.3g}"
        )
    if onnx.output_nan or onnx.output_inf:
        m.fail(
            "onnx_nonfinite",
            f"ONNX artifact output {onnx.output_name!r} has {onnx.output_nan} NaN and "
            f"{onnx.output_inf} Inf values"
        )
    if onnx.unmapped:
        names = ", ".join(u.layer for u in onnx.unmapped[:8])
        more = len(onnx.unmapped) - 8
        m.note(
            f"ONNX: {len(onnx.unmapped)} layer(s) not compared ({names}"
            f"{f', +{more} more' if more > 0 else ''}); reasons in details"
        )


def measure(ctx: Context, thresholds: Mapping[str, float]) -> Measurement:
    """Measure every layer in each configured low-precision dtype against fp32."""
    from paritygate.precision.analysis import run_precision
    from paritygate.precision.budgets import short_name, unit_roundoff

    m = Measurement(CHECK_ID)
    subject = ctx.precision_subject()
    if subject is None:
        return m.skip("this model family provides no per-layer precision subject")
    if subject.skip is not None:
        return m.skip(subject.skip)
    if subject.refusal is not None:
        m.fail("not_checkpoint_weights", subject.refusal)
        return m
    spec = ctx.config.precision
    report = run_precision(
        subject,
        spec,
        float(thresholds["local_budget_ulps"]),
        float(thresholds["output_budget_ulps"]),
        float(thresholds["onnx_fp32_rel_l2"]),
    )
    report.headroom_max = float(thresholds["headroom_max"])  # its plot marks the threshold
    m.record(PrecisionDetails(report))
    if report.reference_output_nonfinite:
        m.fail(
            "reference_nonfinite",
            f"fp32 reference output has {report.reference_output_nonfinite} NaN/Inf values")
    skipped = {d: s.error for d, s in report.summary.items() if s.error}
    for dtype, reason in skipped.items():
        m.note(f"{dtype} skipped: the model does not run in {dtype}: {reason}")
    if skipped and len(skipped) == len(report.summary) and not m.findings:
        return m.skip("; ".join(f"the model does not run in {d}: {r}" for d, r in skipped.items()))
    measured = [d for d in report.summary if d not in skipped]
    for dtype, summary in report.summary.items():
        prefix = short_name(dtype)
        if dtype in skipped:
            continue
        # Noise floors: rounding alone moves a layer's error by about one unit roundoff u and
        # the output's by u * sqrt(depth) (the budgets' derivation), whatever the weights: a
        # later clean checkpoint is another draw of it (measured 5x apart between two saves).
        m.metric(
            f"{prefix}/output_rel_l2",
            summary.output_rel_l2,
            threshold=summary.output_budget,
            key=dtype == measured[0],
            noise=summary.output_budget / float(thresholds["output_budget_ulps"]),
        )
        m.metric(
            f"{prefix}/layers_over_budget",
            summary.layers_over_budget,
            threshold=0,
            ratchet=False,
        )
        m.metric(
            f"{prefix}/max_headroom",
            summary.max_headroom,
            threshold=thresholds["headroom_max"],
            ratchet=False,
        )
        for row in report.dtype_rows(dtype):
            judged = not row.local_error and not row.input_beyond_range
            m.metric(
                f"{prefix}/{row.layer}/local_rel_l2",
                row.local_rel_l2 if judged else None,
                threshold=row.budget,
                detail=True,
                noise=unit_roundoff(dtype),
            )
        beyond = summary.input_beyond_range
        if beyond:
            m.note(
                f"{dtype}: {len(beyond)} layer(s) not judged on local error, their fp32 input "
                f"beyond {dtype}'s range ({', '.join(beyond[:5])}): the overflow is the layer "
                "before's, and their rerun sees it clipped"
            )
        if summary.local_unmeasured:
            names = ", ".join(summary.local_unmeasured[:5])
            m.note(
                f"{dtype}: local error not measured for {len(summary.local_unmeasured)} "
                f"layer(s) that do not rerun alone ({names}); reasons in the per-layer rows"
            )
        _dtype_findings(m, dtype, summary)
    if report.onnx is not None:
        _onnx_metrics(m, report.onnx)
    for note in report.notes:
        m.note(note)
    return m


CHECK = CheckSpec(
    id=CHECK_ID,
    summary="fp16/bf16 error per layer is within budget and no worse than golden",
    measures={"policy": measure, "causal_lm": measure, "hf_model": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("first_divergent_layer", "lowp_nonfinite", "onnx_uncomparable",
           "onnx_divergent_layer", "onnx_nonfinite", "not_checkpoint_weights",
           "reference_nonfinite"),
)

POSITION = 110
"""The check's place in the checklist (and in every report): the registry sorts by it."""
