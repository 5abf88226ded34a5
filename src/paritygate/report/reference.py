"""reference_parity's report section: the KL estimator's form and the reference's identity."""

from __future__ import annotations

from pathlib import Path

from paritygate.checks._kl_reduction import Reduction
from paritygate.checks.reference_parity import (
    Estimator,
    EstimatorForm,
    InitialRecord,
    LogprobFunction,
    ReferenceDigest,
)
from paritygate.fragments import Rendered
from paritygate.report.render import section
from paritygate.result import CheckResult


def render_reference(result: CheckResult, report_dir: Path, *, figures: bool = True
                     ) -> Rendered:
    """The estimator's recognised form and reduction, the reference's log-prob function,
    dtype and digest, and the tensors that differ from the initial policy (eight at most)."""
    d = result.details
    estimator, form = Estimator.read(d), EstimatorForm.read(d)
    reduction, function = Reduction.read(d), LogprobFunction.read(d)
    digest, initial = ReferenceDigest.read(d), InitialRecord.read(d)
    rows = [["KL estimator", estimator.kl_estimator if estimator else "-"],
            ["recognised form", form.kl_form if form else "-"],
            ["per-sequence reduction", reduction.kl_reduction if reduction else "- (per token)"],
            ["reference log-prob function", function.logprob_fn if function else "-"],
            ["reference dtype", estimator.reference_dtype if estimator else "-"],
            ["reference digest (sha256)",
             (digest.reference_digest_sha256 if digest else "-")[:16]]]
    diffs = initial.initial_comparison.value_diffs if initial else {}
    rows += [[f"differs from initial: {name}", f"max abs {value:.3g}"]
             for name, value in list(diffs.items())[:8]]
    return section("reference_parity", ["what", "value"], rows)
