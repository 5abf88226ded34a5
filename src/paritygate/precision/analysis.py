"""From raw accumulators to a judged :class:`~paritygate.precision.report.PrecisionReport`.

``run_precision(subject, spec, k_local, k_out)`` is the library entry point:
it builds the model once, runs the precision pass (and the ONNX comparison),
applies the budgets, locates the first divergent layer per dtype and, when the
output is over budget, searches and verifies a mixed-precision fix.
"""

from __future__ import annotations

import math

from paritygate.precision.budgets import local_budget_ulps, output_budget, unit_roundoff
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.measure import LayerRecord, PrecisionRun, measure_model
from paritygate.precision.report import (
    DtypeSummary,
    FirstDivergent,
    LayerRow,
    MixedFix,
    PrecisionReport,
)
from paritygate.precision.subject import PrecisionSubject

BUDGET_FORMULA = (
    "local budget of a layer = k_local * u (u = 2^-11 float16, 2^-8 bfloat16, 2^-24 float32; "
    "k_local from thresholds.local_budget_ulps or precision.budgets globs); "
    "output budget = k_out * u * sqrt(D), D = parameterised layer calls per forward; "
    "ONNX artifact tensors: the output formula at the layer's depth for a float16/bfloat16 "
    "artifact, a flat onnx_fp32_rel_l2 for a float32 one"
)


def _layer_row(
    record: LayerRecord,
    dtype: str,
    spec: PrecisionSpec,
    k_local: float,
    beyond: dict[str, int] | None = None,
) -> LayerRow:
    layer = record.key.split("#")[0]
    k = local_budget_ulps(layer, dtype, k_local, spec.budgets)
    budget = k * unit_roundoff(dtype)
    local, cum, cum_in = record.local[dtype], record.cum[dtype], record.cum_in[dtype]
    cum_err, in_err = cum.rel_l2, cum_in.rel_l2
    amplification = cum_err / in_err if in_err > 0 and math.isfinite(in_err) else None
    error = record.errors.get(dtype)
    clamped = record.clamped.get(dtype, False)
    nonfinite = local.nan + local.inf
    # A layer whose rerun alone fails (a call that cannot be replayed outside its model)
    # ran in the whole-model pass; its row says why and it is not judged on local error.
    # Nor is a layer whose fp32 input is beyond the format's range: the layer before it
    # overflowed (and is judged), this one only sees the clipping.
    over = error is None and not clamped and (nonfinite > 0 or not local.rel_l2 <= budget)
    return LayerRow(
        dtype=dtype,
        index=record.index,
        layer=record.key,
        type=record.info.type,
        kind=record.info.kind,
        budget_ulps=k,
        budget=budget,
        **local.summary("local"),
        **cum.summary("cum"),
        cum_in_rel_l2=in_err,
        amplification=amplification,
        headroom=record.act.headroom(dtype),
        underflow_fraction=record.act.underflow_fraction(dtype),
        numel=record.act.numel,
        over_budget=over,
        local_error=error,
        input_beyond_range=clamped,
        # only on a layer whose weights a cast turns into Inf
        weights_beyond_range=_own_weights(layer, beyond or {}),
    )


def _own_weights(layer: str, beyond: dict[str, int]) -> dict[str, int]:
    """The layer's parameters (its own and its children's) among those beyond range."""
    prefix = f"{layer}." if layer else ""
    return {name: n for name, n in beyond.items() if name.startswith(prefix)}


def _divergence_reason(row: LayerRow) -> str:
    if row.local_error:
        return f"its {row.dtype} run failed: {row.local_error}"
    if row.local_nan or row.local_inf:
        cast = ""
        if row.weights_beyond_range:
            name, n = max(row.weights_beyond_range.items(), key=lambda item: item[1])
            cast = (f"; its weights themselves overflow: {n} values of {name} exceed "
                    f"{row.dtype}'s largest finite value and become Inf when cast")  # fmt: skip
        return (
            f"{row.local_inf} Inf and {row.local_nan} NaN values in its {row.dtype} "
            "output "
            f"(max |activation| {row.headroom:.3g} x the format's largest finite value){cast}"
        )
    return f"local rel L2 error {row.local_rel_l2:.3g} exceeds its budget {row.budget:.3g}"


def analyse(
    run: PrecisionRun, spec: PrecisionSpec, k_local: float, k_out: float
) -> PrecisionReport:
    """Rows per (dtype, layer) and a judged summary per dtype."""
    rows: list[LayerRow] = []
    summary: dict[str, DtypeSummary] = {}
    for dtype in run.dtypes:
        beyond = run.weights_beyond_range.get(dtype)
        dtype_rows = [_layer_row(r, dtype, spec, k_local, beyond) for r in run.layers]
        rows.extend(dtype_rows)
        out = run.output[dtype]
        over = [r for r in dtype_rows if r.over_budget]
        first = over[0] if over else None
        worst = max(dtype_rows, key=lambda r: _headroom_order(r.headroom), default=None)
        budget = output_budget(dtype, k_out, run.depth)
        summary[dtype] = DtypeSummary(
            error=run.errors.get(dtype),
            output_rel_l2=out.rel_l2,
            output_max_abs=out.max_abs,
            output_cosine=out.cosine,
            output_nan=out.nan,
            output_inf=out.inf,
            output_budget=budget,
            output_over_budget=out.nan + out.inf > 0 or not out.rel_l2 <= budget,
            layers_over_budget=len(over),
            first_divergent=None
            if first is None
            else FirstDivergent(
                layer=first.layer,
                index=first.index,
                type=first.type,
                local_rel_l2=first.local_rel_l2,
                budget=first.budget,
                reason=_divergence_reason(first),
            ),
            local_unmeasured=[r.layer for r in dtype_rows if r.local_error],
            input_beyond_range=[r.layer for r in dtype_rows if r.input_beyond_range],
            max_headroom=worst.headroom if worst else 0.0,
            max_headroom_layer=worst.layer if worst else None,
        )
    return PrecisionReport(
        dtypes=list(run.dtypes),
        depth=run.depth,
        k_local=k_local,
        k_out=k_out,
        budget_formula=BUDGET_FORMULA,
        rows=rows,
        summary=summary,
        reference_output_nonfinite=run.reference_output_nonfinite,
        notes=list(run.notes),
    )


def _headroom_order(value: float) -> float:
    """The largest headroom first, a NaN (no finite activation) as the largest."""
    return math.inf if math.isnan(value) else value


def _ranked(report: PrecisionReport, dtype: str) -> list[str]:
    """Layer names, most sensitive first: non-finite, then local error over budget."""
    rows = [r for r in report.dtype_rows(dtype) if "#" not in r.layer]

    def score(row: LayerRow) -> tuple[int, float, int]:
        bad = 1 if (row.local_nan or row.local_inf or row.local_error) else 0
        value = row.local_rel_l2
        ratio = value / row.budget if math.isfinite(value) else math.inf
        return (-bad, -ratio, row.index)

    return [r.layer for r in sorted(rows, key=score)]


def run_precision(
    subject: PrecisionSubject,
    spec: PrecisionSpec,
    k_local: float,
    k_out: float,
    onnx_fp32_budget: float = 1e-5,
) -> PrecisionReport:
    """Measure ``subject`` per layer in every configured dtype and judge it against the budgets."""
    import torch

    from paritygate.precision.mixed import LARGE_SHARE, MixedRunner, suggest_mixed

    torch.manual_seed(0)
    model = subject.build_model()
    model.eval()
    batches = subject.batches[: spec.max_batches] if spec.max_batches else subject.batches
    onnx = None
    skipped: str | None = None
    if spec.onnx_compare and subject.onnx_path is not None:
        from paritygate.precision.onnx_compare import OnnxComparison

        onnx = OnnxComparison(subject.onnx_path, subject.onnx_feeds or [], subject.onnx_output_name,
                              output_transform=subject.onnx_output_transform)
        problem = onnx.unrunnable()
        if problem is not None:
            skipped = (
                f"ONNX per-layer comparison skipped: the artifact does not run on a probe "
                f"batch ({problem}); export_integrity checks its batch axis"
            )
            onnx = None
    run = measure_model(
        model, batches, subject.select_output, spec, onnx=onnx, spill=subject.streamed
    )
    report = analyse(run, spec, k_local, k_out)
    report.notes.extend(subject.extra.get("notes", []))
    if skipped is not None:
        report.notes.append(skipped)
    if spec.local_max_batches is not None and spec.local_max_batches < len(batches):
        report.notes.append(
            f"local error measured on the first {spec.local_max_batches} of {len(batches)} probe "
            "batches (precision.local_max_batches); cumulative and output error on all"
        )
    if onnx is not None:
        report.onnx = onnx.report(run, k_out, onnx_fp32_budget)
    if spec.suggest_mixed:
        runner = MixedRunner(model, batches, subject.select_output, run.modules)
        for dtype, summary in report.summary.items():
            if summary.output_over_budget and summary.error is None:
                found = suggest_mixed(
                    runner,
                    dtype,
                    _ranked(report, dtype),
                    summary.output_budget,
                    spec.max_suggest_runs,
                )
                share = max((runner.share(n) for n in found.keep_fp32), default=0.0)
                summary.mixed = MixedFix(
                    keep_fp32=found.keep_fp32,
                    verified=found.verified,
                    output_rel_l2=found.output_rel_l2,
                    share=share,
                    large=share > LARGE_SHARE,
                    runs=found.runs,
                    tried=found.tried,
                )
    return report
