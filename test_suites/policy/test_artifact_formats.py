"""TorchScript and torch.export artifacts are gated like ONNX ones.

The clean twins (traced, scripted, exported) pass every policy check and precision_per_layer;
a stale artifact and artifacts saved in training mode fail by the kinds the ONNX zoo's faults
of the same nature record. A file in no format the gate reads, and a ``.pt2`` without the
pickle opt-in, are bad input (exit 2, one line naming the file and key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from format_zoo import ENTRIES, ENTRIES_BY_ID
from policy_zoo import POLICY_CHECKS, evaluate_all, fault_config
from test_bad_input import assert_input_error, run_in_process, write_config

CHECKS = (*POLICY_CHECKS, "precision_per_layer")
_cache: dict[str, dict[str, Any]] = {}


def results(entry_id: str, clean: Path, root: Path) -> dict[str, Any]:
    if entry_id not in _cache:
        out = root / entry_id
        entry = ENTRIES_BY_ID[entry_id]
        _cache[entry_id] = evaluate_all(fault_config(clean, out, entry.build(clean, out)), CHECKS)
    return _cache[entry_id]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("formats")


@pytest.mark.parametrize("entry_id", [e.id for e in ENTRIES if e.check is None])
def test_clean_artifact_passes(entry_id: str, clean_demo: Path, root: Path) -> None:
    got = results(entry_id, clean_demo, root)
    assert {c: r.status for c, r in got.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in got.items() if r.status != "pass"}
    provenance = got["export_integrity"]
    assert provenance.metrics["manifest_present"] == 0
    assert "proven numerically" in str(provenance.to_json()), provenance.to_json()


@pytest.mark.parametrize("entry_id", [e.id for e in ENTRIES if e.check is not None])
def test_faulty_artifact_fails_by_kind(entry_id: str, clean_demo: Path, root: Path) -> None:
    entry = ENTRIES_BY_ID[entry_id]
    result = results(entry_id, clean_demo, root)[entry.check]
    assert result.status == "fail", result.message
    assert entry.kind in result.finding_kinds(), result.message
    assert all(r.status != "error" for r in results(entry_id, clean_demo, root).values())


def test_unsupported_file_is_bad_input(clean_demo: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "policy.bin"
    junk.write_bytes(bytes(range(256)) * 16)
    config = write_config(tmp_path / "gate", clean_demo, {"policy": {"artifact": str(junk)}})
    line = assert_input_error(*run_in_process(capsys, config), file=junk,
                              key="policy.artifact", cause="the gate reads ONNX")
    assert "TorchScript" in line and "torch.export" in line


def test_pt2_needs_the_pickle_opt_in(clean_demo: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    overrides = ENTRIES_BY_ID["pt2_clean"].build(clean_demo, tmp_path / "art")
    artifact = Path(overrides["policy"]["artifact"])
    config = write_config(tmp_path / "gate", clean_demo, {"policy": overrides["policy"]})
    assert_input_error(*run_in_process(capsys, config), file=artifact, key="allow_pickle",
                       cause="set allow_pickle: true")


def test_declared_format_wins(clean_demo: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """``policy.artifact_format`` names the format: a TorchScript file declared ONNX is read
    as ONNX and refused by ONNX Runtime, naming policy.artifact."""
    overrides = ENTRIES_BY_ID["torchscript_clean"].build(clean_demo, tmp_path / "art")
    artifact = Path(overrides["policy"]["artifact"])
    config = write_config(tmp_path / "gate", clean_demo,
                          {"policy": {"artifact": str(artifact), "artifact_format": "onnx"}})
    assert_input_error(*run_in_process(capsys, config), file=artifact, key="policy.artifact",
                       cause="ONNX Runtime cannot load")


def test_scripted_inference_model_skips_precision_with_a_reason(clean_demo: Path,
                                                                tmp_path: Path) -> None:
    """precision_per_layer on a TorchScript inference model is skipped, naming why; never an
    error from hooks the module does not take."""
    config = fault_config(clean_demo, tmp_path, {"policy": {
        "inference_factory": "format_zoo:scripted_inference_model"}})
    result = evaluate_all(config, ("precision_per_layer",))["precision_per_layer"]
    assert result.status == "skip", result.message
    assert "TorchScript module" in result.message and "hooks" in result.message


@pytest.mark.parametrize(("name", "declared", "cause"), [
    ("policy.pt2", None, "not a torch.export program"),
    ("policy.pt", "torchscript", "torch.jit.load cannot load"),
])
def test_artifact_that_does_not_load_is_bad_input(clean_demo: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str], name: str,
                                                  declared: str | None, cause: str) -> None:
    """A truncated ``.pt2`` and a file declared TorchScript that is not: exit 2, one line."""
    built = ENTRIES_BY_ID["pt2_clean" if name.endswith("pt2") else "torchscript_clean"].build(
        clean_demo, tmp_path / "art")
    artifact = tmp_path / name
    data = Path(built["policy"]["artifact"]).read_bytes()
    artifact.write_bytes(data[: len(data) // 2])
    policy: dict[str, Any] = {"artifact": str(artifact)}
    if declared:
        policy["artifact_format"] = declared
    config = write_config(tmp_path / "gate", clean_demo,
                          {"policy": policy, "allow_pickle": name.endswith("pt2")})
    assert_input_error(*run_in_process(capsys, config), file=artifact, key="policy.artifact",
                       cause=cause)


@pytest.mark.parametrize("base", ["cartpole", "recurrent"])
def test_torchscript_artifact_steps_rollouts_and_sequences(zoo: Any, build_once: Any, base: str,
                                                           tmp_path: Path) -> None:
    """rollout_parity (PPO CartPole, episodes stepped by the TorchScript artifact) and
    recurrent_parity (an LSTM actor, its state fed back) run on TorchScript as on ONNX."""
    from format_zoo import traced_from
    from policy_zoo import SUBJECTS, checks_of

    if base in SUBJECTS:  # built as the shape zoo builds it
        build = SUBJECTS[base].build
        clean = build_once(f"shape-{base}", lambda out: build(out / base)) / base
    else:
        clean = zoo.clean_for(base)
    onnx_config = fault_config(clean, tmp_path / "onnx", {}, base)
    artifact = traced_from(onnx_config, tmp_path / "ts")
    config = fault_config(clean, tmp_path / "gate", {"policy": {"artifact": str(artifact)}}, base)
    checks = checks_of(base)
    as_onnx = {c: r.status for c, r in evaluate_all(onnx_config, checks).items()}
    got = evaluate_all(config, checks)
    assert {c: r.status for c, r in got.items()} == as_onnx, {
        c: r.message for c, r in got.items() if r.status != "pass"}
    looped = "rollout_parity" if base == "cartpole" else "recurrent_parity"
    assert as_onnx[looped] == "pass" and set(as_onnx.values()) <= {"pass", "skip"}
