"""The demo LM gate's report.json is byte-identical to its snapshot (see report_snapshot)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report_snapshot import REPO, assert_matches_snapshot, demo_config, normalised_report


def test_demo_lm_report_snapshot(demo_lm: Path, tmp_path: Path) -> None:
    config = demo_config("demo-lm", {
        "causal_lm.model_dir": str(demo_lm),
        "causal_lm.tokenizer.training": str(demo_lm),
        "causal_lm.tokenizer.serving": str(demo_lm),
        "causal_lm.sampling.training": str(REPO / "configs/sampling/demo-lm-train.yaml"),
        "causal_lm.sampling.serving": str(REPO / "configs/sampling/demo-lm-vllm.yaml"),
        "causal_lm.probes": str(REPO / "golden/demo-lm/probes.jsonl"),
    })
    config["skip_checks"] = ["vllm_delta"]  # the CPU gate: `-m "not vllm"`
    # torch's reductions depend on its thread count: one thread, whatever the worker's share
    config["threads"] = 1
    text = normalised_report(config, tmp_path / "demo-lm.yaml", {str(demo_lm): "<demo>"})
    assert '"status": "pass"' in text
    assert_matches_snapshot("demo-lm", text)
