"""The rollout demo ``paritygate demo --only rollout`` ships: a CartPole-v1 policy whose
``rollout_parity`` passes in the real Gymnasium environment against the shipped golden, and a
faulty twin (an export that swaps the two actions' logits) that fails by its diverging actions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("gymnasium", reason="gymnasium not installed (extra 'rollout')")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG", "CI")}
    return subprocess.run([sys.executable, "-m", "paritygate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=env)


def _demo(out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = _cli("demo", "--only", "rollout", "--out", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def demo(build_once: Any) -> Path:
    return build_once("demo-rollout", lambda out: _demo(out / "demo")) / "demo"  # type: ignore[no-any-return]


def test_demo_rollout_passes_against_the_shipped_golden(demo: Path, tmp_path: Path) -> None:
    config = demo / "configs" / "demo-rollout.yaml"
    assert sorted(p.name for p in (demo / "golden" / "demo-rollout").glob("*.json")) == [
        "export_integrity.json", "head_removal.json", "logits_agreement.json",
        "rollout_parity.json", "weights_load.json"]
    proc = _cli("run", str(config), "--report-dir", str(tmp_path / "report"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rollout = next(c for c in report["checks"] if c["id"] == "rollout_parity")
    assert rollout["status"] == "pass" and rollout["metrics"]["episodes"] == 3
    assert rollout["metrics"]["action_agreement"] == 1.0
    assert rollout["metrics"]["steps"] == 600  # the policy balances the pole: 3 x 200 steps


def _swapped_export(demo: Path, out: Path) -> Path:
    """The team's export with the action order reversed (logit rows swapped)."""
    import torch
    from safetensors.torch import load_file

    from paritygate.demo.rollout import build_inference_model
    from paritygate.families.policy.export import export_onnx

    state = load_file(str(demo / "rollout" / "policy.safetensors"))
    model = build_inference_model()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("value_head.")})
    with torch.no_grad():
        head = model.policy_head
        head.weight.copy_(head.weight.flip(0))
        head.bias.copy_(head.bias.flip(0))
    return export_onnx(model.eval(), torch.zeros(2, 4), out, input_name="obs",
                       output_names=["logits"])


def test_demo_rollout_faulty_twin_fails_by_its_actions(demo: Path, tmp_path: Path) -> None:
    artifact = _swapped_export(demo, tmp_path / "swapped" / "policy.onnx")
    data = yaml.safe_load((demo / "configs" / "demo-rollout.yaml").read_text())
    data["policy"]["checkpoint"] = str(demo / "rollout" / "policy.safetensors")
    data["policy"]["artifact"] = str(artifact)
    data["checks"] = ["rollout_parity"]
    data["golden"] = {"dir": str(demo / "golden")}
    config = tmp_path / "faulty.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = _cli("run", str(config), "--report-dir", str(tmp_path / "report"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rollout = next(c for c in report["checks"] if c["id"] == "rollout_parity")
    assert rollout["status"] == "fail"
    findings = [r["finding"] for r in rollout["reasons"] if r["kind"] == "finding"]
    assert findings and findings[0] == "action_divergence", rollout["reasons"]
    assert rollout["metrics"]["first_divergent_step"] == 0
