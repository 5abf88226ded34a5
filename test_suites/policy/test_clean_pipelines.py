"""Clean checkpoints from other pipelines pass with zero false alarms; one baseline serves many
candidates; a failing run is never offered for blessing; python_path and edge-case kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import policy_zoo_builders as zb
import pytest
from policy_zoo import POLICY_CHECKS, base_config, merge

from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytestmark = pytest.mark.xdist_group("policy-clean-pipelines")

_F = zb.FAULTS_MODULE


def _gate(clean: Path, root: Path, overrides: dict[str, Any], *, name: str = "clean",
          baseline: str | None = None, update_golden: bool = False) -> Gate:
    data = merge(base_config(clean), overrides)
    data["name"] = name
    data["golden"] = {"dir": str(root / "golden"), **({"baseline": baseline} if baseline else {})}
    root.mkdir(parents=True, exist_ok=True)
    return Gate(config_from_dict(data, root / f"{name}.yaml"), update_golden=update_golden)


def _statuses(gate: Gate, *, golden: bool) -> dict[str, str]:
    results = {cid: gate.evaluate(cid, golden=golden) for cid in POLICY_CHECKS}
    return {cid: f"{r.status}: {r.message}" for cid, r in results.items()}


def _all_pass(statuses: dict[str, str]) -> None:
    failing = {cid: s for cid, s in statuses.items() if not s.startswith("pass")}
    assert not failing, failing


@pytest.mark.parametrize("builder", [zb.plain_torch_export, zb.no_manifest],
                         ids=["plain_torch_onnx_export", "artifact_without_manifest"])
def test_artifact_without_manifest_passes_after_one_bless(
    clean_demo: Path, tmp_path: Path, builder: Any
) -> None:
    overrides = builder(clean_demo, tmp_path / "artifact")
    assert not (tmp_path / "artifact" / "manifest.json").exists()
    bless = _gate(clean_demo, tmp_path, overrides, update_golden=True)
    _all_pass(_statuses(bless, golden=True))
    again = _gate(clean_demo, tmp_path, overrides)
    results = {cid: again.evaluate(cid) for cid in POLICY_CHECKS}
    _all_pass({cid: f"{r.status}: {r.message}" for cid, r in results.items()})
    notes = " ".join(results["export_integrity"].details.get("notes", []))
    assert "no manifest: provenance proven numerically, max diff" in notes
    assert "against the inference model built from this checkpoint" in notes
    assert "weight initializers match checkpoint tensors" in notes


def test_declared_fp16_conversion_passes_by_its_tier(clean_demo: Path, tmp_path: Path) -> None:
    """An artifact converted to float16 and declared so is judged by the fp32/fp16 tier and its
    provenance proven against the checkpoint cast to float16."""
    overrides = zb.fp16_converted("float16")(clean_demo, tmp_path / "artifact")
    data = merge(base_config(clean_demo), overrides)
    data.pop("thresholds", None)  # the demo pins logits_agreement.max_abs_diff to fp32's 2e-5
    data["name"] = "fp16"
    (tmp_path / "g").mkdir()
    gate = Gate(config_from_dict(data, tmp_path / "g" / "fp16.yaml"))
    results = {cid: gate.evaluate(cid, golden=False) for cid in POLICY_CHECKS}
    _all_pass({cid: f"{r.status}: {r.message}" for cid, r in results.items()})
    notes = " ".join(results["export_integrity"].details.get("notes", []))
    assert "stores float16 weights, as policy.artifact_dtype declares" in notes
    assert "provenance proven against the checkpoint cast to float16" in notes
    logits = results["logits_agreement"]
    assert "limits from the fp16/fp32 precision tier" in " ".join(logits.details["notes"])
    assert logits.thresholds["max_abs_diff"] > 1e-2  # the tier's, not fp32's 2e-5


@pytest.mark.parametrize("pair", [
    ("normalize_training_propagate", "normalize_serving_propagate"),
    ("normalize_training_log", "normalize_serving_log"),
], ids=["nan_propagated_by_both", "log_nan_at_same_positions"])
def test_nan_at_the_same_positions_is_agreement(
    clean_demo: Path, tmp_path: Path, pair: tuple[str, str]
) -> None:
    gate = _gate(clean_demo, tmp_path, {"policy": {"preprocessing": {
        "training": f"{_F}:{pair[0]}", "serving": f"{_F}:{pair[1]}"}}})
    result = gate.evaluate("preprocessing_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["nonfinite_mismatches"] == 0
    assert any("(agreement)" in n for n in result.details.get("notes", []))


def test_many_candidates_gate_against_one_baseline(clean_demo: Path, tmp_path: Path) -> None:
    bless = _gate(clean_demo, tmp_path, {}, name="candidate-a", baseline="my-policy",
                  update_golden=True)
    _all_pass(_statuses(bless, golden=True))
    assert (tmp_path / "golden" / "my-policy" / "logits_agreement.json").exists()
    assert not (tmp_path / "golden" / "candidate-a").exists()
    other = _gate(clean_demo, tmp_path, {}, name="candidate-b", baseline="my-policy")
    _all_pass(_statuses(other, golden=True))
    faulty = _gate(clean_demo, tmp_path, {"policy": {"preprocessing": {
        "serving": f"{_F}:normalize_serving_fill_zero"}}}, name="candidate-c",
        baseline="my-policy")
    result = faulty.evaluate("preprocessing_parity")
    assert result.status == "fail"
    assert "bless" not in result.message, result.message


def test_only_a_missing_baseline_suggests_blessing(clean_demo: Path, tmp_path: Path) -> None:
    clean = _gate(clean_demo, tmp_path, {}, name="fresh")
    result = clean.evaluate("head_removal")
    assert result.status == "fail" and "no golden baseline" in result.message
    assert "Bless with: paritygate run" in result.message
    faulty = _gate(clean_demo, tmp_path, {"policy": {"preprocessing": {
        "serving": f"{_F}:normalize_serving_clip"}}}, name="fresh-faulty")
    result = faulty.evaluate("preprocessing_parity")
    assert result.status == "fail" and "no golden baseline" in result.message
    assert "bless with" not in result.message.lower(), result.message


def test_python_path_imports_user_code_relative_to_the_config(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "my_pipeline_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import numpy as np\n\n"
        "def probes(count, seed):\n"
        "    return np.random.default_rng(seed).normal(size=(count, 3)).astype(np.float32)\n",
        encoding="utf-8")
    data = {"name": "pp", "family": "policy", "python_path": ["src"], "policy": {
        "training_factory": "m:f", "inference_factory": "m:g", "checkpoint": "c.safetensors",
        "probes": {"generator": "my_pipeline_pkg:probes", "count": 4}}}
    config = config_from_dict(data, tmp_path / "gate.yaml")
    from paritygate.imports import import_callable

    fn = import_callable("my_pipeline_pkg:probes", config.path, "policy.probes.generator")
    assert fn(4, 0).shape == (4, 3)
    data["python_path"] = ["no-such-folder"]
    missing = config_from_dict(data, tmp_path / "other.yaml")
    with pytest.raises(InputError) as err:
        import_callable("my_pipeline_pkg:probes", missing.path, "policy.probes.generator")
    assert err.value.key == "python_path[0]" and "folder not found" in err.value.cause


def test_edge_case_kinds(clean_demo: Path, tmp_path: Path) -> None:
    gate = _gate(clean_demo, tmp_path, {"policy": {"probes": {"edge_cases": ["extremes"]}}})
    result = gate.evaluate("preprocessing_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.details["cases"] == ["extreme_high", "extreme_low", "probes", "zeros"]
    with pytest.raises(InputError) as err:
        _gate(clean_demo, tmp_path, {"policy": {"probes": {"edge_cases": ["nan"]}}})
    assert err.value.key == "policy.probes.edge_cases" and "unknown edge-case kinds" in \
        err.value.cause


@pytest.mark.parametrize(("serving", "passes"), [("normalize_serving_unclipped", True),
                                                 ("normalize_serving_unclipped_epsilon", False)])
def test_an_unclipped_normaliser_written_otherwise_is_rounding_at_the_extremes(
    clean_demo: Path, tmp_path: Path, serving: str, passes: bool
) -> None:
    """No clip: at the extreme inputs (1e4) outputs reach thousands, where float32's ulp is
    ~5e-4, so two writings of one normaliser differ by more than the 1e-5 threshold; that is
    rounding (ROUNDING_ULPS of the value) and passes, while another epsilon still fails."""
    gate = _gate(clean_demo, tmp_path, {"policy": {
        "preprocessing": {"training": f"{_F}:normalize_training_unclipped",
                          "serving": f"{_F}:normalize_serving_{serving.split('serving_')[1]}"},
        "probes": {"edge_cases": ["extremes"]}}}, name=serving.replace("_", "-"))
    result = gate.evaluate("preprocessing_parity", golden=False)
    if passes:
        assert result.status == "pass", result.message
        assert result.metrics["max_abs_diff"] == 0.0
    else:
        assert result.status == "fail" and "max_abs_diff" in result.failed_metrics, result.message

