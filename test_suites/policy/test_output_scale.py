"""Absolute fp32 limits grow with the outputs' magnitude: a clean policy with large logits
passes, and a stale artifact at that magnitude still fails.

Two fp32 paths (torch and ONNX Runtime) differ by a few ulp of the values they compute; at
|logit| ~1e4 one ulp is ~1e-3, far above the 2e-5 calibrated at the demo's |logit| ~10.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import policy_zoo_builders as zb
import pytest
from policy_zoo import evaluate_all, fault_config

SCALE = 3000.0


def _large(state: dict[str, Any]) -> dict[str, Any]:
    """The policy head scaled: the same argmax, logits ~3000x the demo's."""
    return {k: v * SCALE if k.startswith("policy_head.") else v for k, v in state.items()}


def _variant(
    clean: Path, out: Path, exported_from: dict[str, Any], manifest: bool = True
) -> Any:
    checkpoint = zb._save(_large(zb._state(clean)), out / "policy.safetensors")
    artifact = zb._export(zb._inference_model(exported_from), out / "policy.onnx")
    if manifest:
        zb._manifest(artifact, checkpoint)
    overrides = {"policy": {"checkpoint": str(checkpoint), "artifact": str(artifact)}}
    return fault_config(clean, out, overrides)


@pytest.mark.xdist_group("output_scale")
def test_a_clean_policy_with_large_logits_passes_and_a_stale_one_fails(
    clean_demo: Path, tmp_path: Path
) -> None:
    large = _large(zb._state(clean_demo))
    results = evaluate_all(_variant(clean_demo, tmp_path / "clean", large))
    logits = results["logits_agreement"]
    assert {cid: r.status for cid, r in results.items()} == dict.fromkeys(results, "pass"), {
        cid: r.message for cid, r in results.items() if r.status != "pass"}
    notes = logits.details.get("notes", [])
    assert any("scaled by the outputs' magnitude" in n for n in notes), notes
    # without a manifest, provenance is proven numerically with the same scaled limit
    bare = evaluate_all(_variant(clean_demo, tmp_path / "bare", large, manifest=False))
    integrity = bare["export_integrity"]
    assert integrity.status == "pass", integrity.message
    assert integrity.details["provenance"] == "numeric"
    # the same magnitude, exported from a checkpoint 1e-4 relative away: still caught
    stale = evaluate_all(_variant(clean_demo, tmp_path / "stale", zb._perturbed(large)))
    assert stale["logits_agreement"].status == "fail"
    assert "artifact logits differ" in stale["logits_agreement"].message
