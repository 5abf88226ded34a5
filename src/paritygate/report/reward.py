"""reward_parity's report section: the samples whose serving score moved most."""

from __future__ import annotations

from pathlib import Path

from paritygate.checks.reward_parity import RewardRecord
from paritygate.fragments import Rendered
from paritygate.report.render import section
from paritygate.result import CheckResult

HEADER = ["sample", "training score", "serving score", "moved", "cut by", "read at a pad"]


def render_reward(result: CheckResult, report_dir: Path, *, figures: bool = True
                  ) -> Rendered:
    """The twelve samples whose serving score moved most (all of them, in order, when none
    moved)."""
    record = RewardRecord.read(result.details)
    samples = record.samples if record is not None else []
    rows = sorted(samples, key=lambda r: -r.moved)[:12]
    cells = [[str(r.id), f"{r.training:.4g}", f"{r.serving:.4g}", f"{r.moved:.3g}",
              r.cut.strip() or "-", "yes" if r.read_at_pad else "-"] for r in rows]
    return section("reward_parity: samples", HEADER, cells,
                   note="the samples whose serving score moved most")
