"""reference_parity's report section: the KL estimator's form and the reference's identity."""

from __future__ import annotations

from pathlib import Path

from paritygate.fragments import Rendered
from paritygate.report.render import section
from paritygate.result import CheckResult


def render_reference(result: CheckResult, report_dir: Path, *, figures: bool = True
                     ) -> Rendered:
    """The estimator's recognised form and reduction, the reference's log-prob function,
    dtype and digest, and the tensors that differ from the initial policy (eight at most)."""
    d = result.details
    rows = [["KL estimator", str(d.get("kl_estimator", "-"))],
            ["recognised form", str(d.get("kl_form", "-"))],
            ["per-sequence reduction", str(d.get("kl_reduction", "- (per token)"))],
            ["reference log-prob function", str(d.get("logprob_fn", "-"))],
            ["reference dtype", str(d.get("reference_dtype", "-"))],
            ["reference digest (sha256)", str(d.get("reference_digest_sha256", "-"))[:16]]]
    diffs = (d.get("initial_comparison") or {}).get("value_diffs") or {}
    rows += [[f"differs from initial: {name}", f"max abs {value:.3g}"]
             for name, value in list(diffs.items())[:8]]
    return section("reference_parity", ["what", "value"], rows)
