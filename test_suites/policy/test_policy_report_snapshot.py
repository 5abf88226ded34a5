"""The demo policy gate's report.json is byte-identical to its snapshot (see report_snapshot)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report_snapshot import assert_matches_snapshot, demo_config, normalised_report


def test_demo_policy_report_snapshot(clean_demo: Path, tmp_path: Path) -> None:
    config = demo_config("demo-policy", {
        "policy.checkpoint": str(clean_demo / "policy.safetensors"),
        "policy.artifact": str(clean_demo / "policy.onnx"),
        "policy.preprocessing.stats": str(clean_demo / "obs_norm.json"),
    })
    text = normalised_report(config, tmp_path / "demo-policy.yaml", {str(clean_demo): "<demo>"})
    assert '"status": "pass"' in text
    assert_matches_snapshot("demo-policy", text)
