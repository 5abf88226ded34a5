"""How the gate calls a policy: several named inputs (a Dict observation, called as one dict,
positionally or by keyword) and recurrent state. A model the gate cannot call, or probes that do
not fit the declared inputs, end in exit 2 with one line naming what the gate expected and the
config key to change; never in checks ending in ``error``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from policy_zoo import SUBJECTS, merge
from test_bad_input import assert_input_error, run_in_process, write_config

from paritygate.errors import InputError
from paritygate.load import config_from_dict


@pytest.fixture(scope="module")
def dict_clean(build_once: Any) -> Path:
    return build_once("shape-dict", lambda out: SUBJECTS["dict"].build(out / "dict")) / "dict"


@pytest.fixture(scope="module")
def recurrent_clean(build_once: Any) -> Path:
    build = SUBJECTS["recurrent"].build
    return build_once("shape-recurrent", lambda out: build(out / "recurrent")) / "recurrent"


def subject_config(folder: Path, subject: str, clean: Path, overrides: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = merge(SUBJECTS[subject].config(clean), overrides)
    data["golden"] = {"dir": str(folder / "golden")}
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _without(cfg: Path, *keys: str) -> Path:
    data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    for key in keys:
        data["policy"].pop(key, None)
    cfg.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return cfg


def test_recurrent_forward_fed_one_tensor_names_policy_inputs(
        recurrent_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _without(subject_config(tmp_path, "recurrent", recurrent_clean,
                                  {"policy": {"output_names": ["logits"]}}),
                   "inputs", "recurrent", "artifact")  # no artifact: nothing is exported
    code, out, err = run_in_process(capsys, cfg)
    line = assert_input_error(
        code, out, err, file=cfg, key="policy.inputs",
        cause="the training forward takes 4 positional arguments (obs, h, c, episode_start) "
              "but the gate feeds one tensor `obs`; declare the inputs in policy.inputs")
    assert "\x1b" not in line and not (tmp_path / "report").exists()


def test_dict_npz_read_as_one_input_names_policy_inputs(
        dict_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paritygate.demo.shapes import dict_probes

    probes = tmp_path / "probes.npz"
    raw = dict_probes(8, 0)
    np.savez(probes, image=raw["image"], vector=raw["vector"])
    cfg = _without(subject_config(tmp_path, "dict", dict_clean, {"policy": {
        "probes": {"file": str(probes), "generator": None}, "call": "positional"}}), "inputs")
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=probes, key="policy.probes.file",
                       cause="the probes hold 2 arrays ['image', 'vector'] but the gate feeds "
                             "one tensor `obs`; declare the inputs in policy.inputs")


def test_keyword_call_of_a_dict_forward_names_policy_call(
        dict_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = subject_config(tmp_path, "dict", dict_clean, {"policy": {"call": "keyword"}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=cfg, key="policy.call",
                       cause="the training forward takes 1 positional argument (obs) but the "
                             "gate feeds the keyword arguments `image`, `vector`, `goal`")


def test_probes_without_a_declared_key(
        dict_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paritygate.demo.shapes import dict_probes

    probes = tmp_path / "probes.npz"
    raw = dict_probes(8, 0)
    np.savez(probes, image=raw["image"], vector=raw["vector"])
    cfg = subject_config(tmp_path, "dict", dict_clean,
                         {"policy": {"probes": {"file": str(probes), "generator": None}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=probes, key="policy.probes.file",
                       cause="the probes have no array for inputs ['goal']")


def test_probe_rows_of_another_shape_than_declared(
        dict_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from paritygate.demo.shapes import dict_probes

    probes = tmp_path / "probes.npz"
    raw = dict_probes(8, 0)
    raw["goal"] = raw["goal"][:, :3]
    np.savez(probes, **raw)
    cfg = subject_config(tmp_path, "dict", dict_clean,
                         {"policy": {"probes": {"file": str(probes), "generator": None}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=probes, key="policy.probes.file",
                       cause="probes of input 'goal' have rows of shape [3], policy.inputs "
                             "declares [4]")


def test_export_failure_is_bad_input_without_terminal_codes(
        clean_demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, clean_demo, {"policy": {
        "inference_factory": "paritygate.demo.faults:build_untraceable_inference"}})
    _without(cfg, "artifact")
    code, out, err = run_in_process(capsys, cfg)
    line = assert_input_error(code, out, err, file=cfg, key="policy.inference_factory",
                              cause="the ONNX export of the inference model failed: ")
    assert "\x1b" not in line


def test_artifact_state_input_of_another_shape(
        recurrent_clean: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = subject_config(tmp_path, "recurrent", recurrent_clean, {"policy": {"recurrent": {
        "states": [{"input": "h_in", "output": "h_out", "shape": [8]},
                   {"input": "c_in", "output": "c_out", "shape": [16]}]}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=recurrent_clean / "policy.onnx", key="inputs.h_in",
                       cause="axis 1 is 16 but the model input has 8")


def test_initial_state_file(recurrent_clean: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "h0.npy"
    np.save(bad, np.zeros(8, np.float32))
    cfg = subject_config(tmp_path, "recurrent", recurrent_clean, {"policy": {"recurrent": {
        "states": [{"input": "h_in", "output": "h_out", "shape": [16], "initial": str(bad)},
                   {"input": "c_in", "output": "c_out", "shape": [16]}]}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=bad, key="policy.recurrent.states[0].initial",
                       cause="initial state of shape [8], the state is declared [16]")


@pytest.mark.parametrize(("policy", "cause"), [
    ({"input_name": "obs", "inputs": ["obs"]}, "give either input_name"),
    ({"inputs": ["a", "a"]}, "input names must be unique"),
    ({"inputs": ["a", "b"], "preprocessing": {"training": "m:f", "serving": "m:g"}},
     "give preprocessing per input"),
    ({"recurrent": {"states": [{"input": "h", "output": "h_out", "shape": [4]}]}},
     "state output 'h_out' is not in output_names"),
    ({"recurrent": {"states": [{"input": "h", "output": "logits", "shape": [4]}]}},
     "is the policy output"),
    ({"call": "kwargs"}, "call"),
])
def test_config_validation(policy: dict[str, Any], cause: str, tmp_path: Path) -> None:
    data = {"name": "x", "family": "policy", "policy": {
        "training_factory": "m:f", "inference_factory": "m:g", "checkpoint": "c.safetensors",
        "probes": {"generator": "m:p"}, **policy}}
    with pytest.raises(InputError) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert cause in str(err.value)


def test_single_input_spec_defaults() -> None:
    from paritygate.config.policy import PolicySpec

    spec = PolicySpec(training_factory="m:f", inference_factory="m:g", checkpoint="c",
                      probes={"generator": "m:p"})
    assert spec.input_names == ["obs"] and spec.call == "positional"
    assert spec.state_input_names == [] and spec.state_output_names == []
    rec = PolicySpec(training_factory="m:f", inference_factory="m:g", checkpoint="c",
                     probes={"generator": "m:p"}, inputs=["obs"],
                     output_names=["logits", "h_out"],
                     recurrent={"states": [{"input": "h_in", "output": "h_out", "shape": [4]}],
                                "episode_start": "start"})
    assert rec.input_names == ["obs", "h_in", "start"]
    assert [i.name for i in rec.observation_inputs] == ["obs"]


def _spec(tmp_path: Path, **policy: Any) -> Any:
    data = {"name": "x", "family": "policy", "policy": {
        "training_factory": "m:f", "inference_factory": "m:g", "checkpoint": "c.safetensors",
        "probes": {"generator": "m:p"}, **policy}}
    return config_from_dict(data, tmp_path / "gate.yaml")


def test_distribution_is_for_single_input_policies(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        _spec(tmp_path, inputs=["a", "b"], distribution={})
    assert "takes one observation input" in str(err.value)


@pytest.mark.parametrize("policy", [
    {"inputs": ["a", "b"]},
    {"inputs": ["obs"], "output_names": ["logits", "h_out"],
     "recurrent": {"states": [{"input": "h_in", "output": "h_out", "shape": [4]}]}},
])
def test_rollout_takes_dict_and_recurrent_policies(policy: dict[str, Any],
                                                   tmp_path: Path) -> None:
    config = _spec(tmp_path, rollout={"env": "CartPole-v1"}, **policy)
    assert config.policy.rollout.env == "CartPole-v1"


def test_uint8_image_probes_keep_their_dtype_through_the_edge_cases(
        dict_clean: Path, tmp_path: Path) -> None:
    """An 8-bit image input holds no NaN: the default edge cases leave ``missing`` out for
    it (with a note) and take its extremes from the dtype; the clean policy passes."""
    from paritygate.demo.shapes import dict_probes
    from paritygate.gate import Gate

    probes = dict_probes(16, 0)
    probes["image"] = probes["image"].astype(np.uint8)
    np.savez(tmp_path / "probes.npz", **probes)
    cfg = subject_config(tmp_path, "dict", dict_clean, {})
    data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    data["policy"]["probes"] = {"file": str(tmp_path / "probes.npz")}
    cfg.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = Gate(config_from_dict(data, cfg))
    for check_id in ("preprocessing_parity", "logits_agreement"):
        result = gate.evaluate(check_id, golden=False)
        assert result.status == "pass", (check_id, result.message)
    notes = gate.evaluate("preprocessing_parity", golden=False).details["notes"]
    assert any("input 'image': edge case 'missing' left out: uint8" in n for n in notes), notes


def test_edge_cases_keep_the_probe_dtype() -> None:
    from paritygate.checks.preprocessing_parity import edge_cases

    raw = np.array([[0, 255], [3, 4]], np.uint8)
    cases = edge_cases(raw)
    assert "missing_value" not in cases and "all_missing" not in cases
    assert all(c.dtype == np.uint8 for c in cases.values())
    assert cases["extreme_high"].max() == 255 and cases["extreme_low"].min() == 0
    floats = edge_cases(raw.astype(np.float32))
    assert np.isnan(floats["all_missing"]).all() and floats["extreme_high"].max() == 1e4


def test_artifact_inputs_in_another_order_pass(dict_clean: Path, tmp_path: Path) -> None:
    """ONNX Runtime feeds inputs by name: an own export that lists the declared inputs in
    another order is the same artifact."""
    import onnx

    from paritygate.gate import Gate

    model = onnx.load(str(dict_clean / "policy.onnx"))
    inputs = list(model.graph.input)
    del model.graph.input[:]
    model.graph.input.extend(reversed(inputs))
    onnx.save(model, str(tmp_path / "reordered.onnx"))
    cfg = subject_config(tmp_path, "dict", dict_clean,
                         {"policy": {"artifact": str(tmp_path / "reordered.onnx")}})
    data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    gate = Gate(config_from_dict(data, cfg))
    assert [i.name for i in onnx.load(str(tmp_path / "reordered.onnx")).graph.input] != [
        i["name"] for i in data["policy"]["inputs"]]
    for check_id in ("export_integrity", "logits_agreement"):
        result = gate.evaluate(check_id, golden=False)
        assert result.status == "pass", (check_id, result.message)
