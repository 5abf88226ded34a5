"""Unit tests of the gate core: verdict rules, golden life cycle, config validation, reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from paritygate.errors import InputError, MissingExtra, keyed
from paritygate.golden import GoldenStore
from paritygate.load import config_from_dict, load_config
from paritygate.report import junit_xml, summary_table
from paritygate.result import CheckResult, Measurement
from paritygate.verdict import Margin, golden_regression, judge

REPO = Path(__file__).resolve().parents[1]


def _measurement(
    value: float, *, bad: str = "higher", threshold: float | None = 1.0
) -> Measurement:
    m = Measurement("demo_check")
    m.metric("err", value, bad=bad, threshold=threshold, key=True)  # type: ignore[arg-type]
    return m


def test_pass_within_threshold_and_golden() -> None:
    r = judge(_measurement(0.5), {"metrics": {"err": 0.5}})
    assert r.status == "pass"
    assert r.message == "err=0.5 (threshold 1)"


def test_threshold_breach_fails_with_numbers() -> None:
    r = judge(_measurement(2.0), {"metrics": {"err": 2.0}})
    assert r.status == "fail"
    assert "err 2 is above the threshold 1" in r.message


def test_lower_is_bad_metric() -> None:
    r = judge(_measurement(0.5, bad="lower", threshold=0.9), {"metrics": {"err": 0.5}})
    assert r.status == "fail" and "err 0.5 is below the threshold 0.9" in r.message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_metric_fails_by_name(value: float) -> None:
    r = judge(_measurement(value), {"metrics": {"err": 0.1}})
    assert r.status == "fail"
    assert "err is" in r.message and "non-finite" in r.message


def test_nan_never_passes_even_without_threshold() -> None:
    r = judge(_measurement(float("nan"), threshold=None), {"metrics": {"err": 0.1}})
    assert r.status == "fail"


def test_finding_fails_regardless_of_numbers() -> None:
    m = _measurement(0.0)
    m.fail("missing_keys", "missing key 'fc.weight'")
    r = judge(m, {"metrics": {"err": 0.0}})
    assert r.status == "fail" and "missing key 'fc.weight'" in r.message


def test_golden_regression_margin() -> None:
    margin = Margin(rel_margin=0.25, threshold_fraction=0.05)
    m = _measurement(0.2).metrics["err"]
    # allowed = 0.25 * 0.1 + 0.05 * 1.0 = 0.075 -> 0.2 > 0.175 regresses
    assert golden_regression(m, 0.1, margin) is not None
    ok = _measurement(0.17).metrics["err"]
    assert golden_regression(ok, 0.1, margin) is None


def test_change_metric_fails_on_any_difference() -> None:
    m = Measurement("c")
    m.metric("n", 3, bad="change")
    assert judge(m, {"metrics": {"n": 4}}).status == "fail"
    assert judge(m, {"metrics": {"n": 3}}).status == "pass"


def test_missing_golden_fails_unless_blessing() -> None:
    assert judge(_measurement(0.1), None).status == "fail"
    assert "no golden baseline" in judge(_measurement(0.1), None).message
    assert judge(_measurement(0.1), None, blessing=True).status == "pass"
    assert judge(_measurement(0.1), None, use_golden=False).status == "pass"


def test_skip_is_reported() -> None:
    m = Measurement("c").skip("no CUDA device")
    r = judge(m, None)
    assert r.status == "skip" and r.message == "no CUDA device"


def test_golden_store_atomic_write_and_obtained(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "g" / "name")
    assert store.load("c") is None
    store.write_obtained("c", {"err": 1.0}, {"sha": "x"})
    assert store.obtained_path("c").exists()
    store.write("c", {"err": 0.5}, {"sha": "y"})
    assert store.load("c") == {"metrics": {"err": 0.5}, "provenance": {"sha": "y"}}
    assert not store.obtained_path("c").exists()
    assert not list(store.directory.glob(".*.tmp"))


def test_golden_file_corrupt_is_input_error(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path)
    store.path("c").write_text("{not json")
    with pytest.raises(InputError) as err:
        store.load("c")
    assert "c.json" in err.value.line()


def test_keyed_names_the_config_key_of_the_file_read() -> None:
    def raised(error: InputError) -> InputError:
        with pytest.raises(InputError) as err, keyed("hf_model.probes"):
            raise error
        return err.value

    whole_file = raised(InputError("p.txt", None, "no texts"))
    assert whole_file.line() == "p.txt: hf_model.probes: no texts"
    inner = raised(InputError("p.jsonl", "line 2.text", "not a string"))
    assert inner.line() == "p.jsonl: hf_model.probes: line 2.text: not a string"
    same_section = raised(InputError("p.txt", "hf_model.batch_size", "set batch_size: 1"))
    assert same_section.line() == "p.txt: hf_model.batch_size: set batch_size: 1"
    missing = MissingExtra("onnxruntime", "onnx")
    assert raised(missing) is missing



def test_every_file_the_config_names_is_reported_with_its_key(tmp_path: Path) -> None:
    """One mechanism: an error about any file a config key names gets that key, however deep
    it was raised (the artifact's own input key kept after it); the config file itself, a
    file no key names and a folder above the config's are left alone."""
    from paritygate.load import config_from_dict

    (tmp_path / "cfg").mkdir()
    config = config_from_dict({
        "name": "x", "family": "hf_model", "golden": {"dir": ".."},
        "hf_model": {"model_dir": "../models/enc", "probes": "p.txt"},
    }, tmp_path / "cfg" / "gate.yaml")  # fmt: skip
    enc = tmp_path / "models" / "enc"
    cases = {
        (tmp_path / "cfg" / "p.txt", "line 3.text"): "hf_model.probes: line 3.text",
        (enc / "config.json", None): "hf_model.model_dir",
        (enc / "config.json", "config.json"): "hf_model.model_dir",  # whole-file key gives way
        (enc / "model.safetensors", "hf_model.tokenizer"): "hf_model.tokenizer",  # same section
        (tmp_path / "cfg" / "gate.yaml", "seed"): "seed",
        (tmp_path / "other.txt", None): None,  # inside golden.dir, a folder above the config's
    }
    for (file, key), named in cases.items():
        assert config.key_error(InputError(file, key, "bad")).key == named, (file, key)


POLICY = {
    "name": "x",
    "family": "policy",
    "policy": {
        "training_factory": "m:f",
        "inference_factory": "m:g",
        "checkpoint": "c.safetensors",
        "probes": {"generator": "m:p"},
    },
}


def _bad(data: dict, tmp_path: Path) -> str:
    with pytest.raises(InputError) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    line = err.value.line()
    assert "\n" not in line
    return line


def test_config_unknown_key_named(tmp_path: Path) -> None:
    data = json.loads(json.dumps(POLICY))
    data["policy"]["checkpiont"] = "typo"
    assert _bad(data, tmp_path) == f"{tmp_path / 'gate.yaml'}: policy.checkpiont: unknown key"


def test_config_wrong_type_named(tmp_path: Path) -> None:
    data = json.loads(json.dumps(POLICY))
    data["policy"]["probes"]["count"] = "many"
    line = _bad(data, tmp_path)
    assert "policy.probes.count" in line and "'many'" in line


def test_config_paths_resolve_once_and_an_empty_one_is_refused(tmp_path: Path) -> None:
    data = json.loads(json.dumps(POLICY))
    data["policy"]["checkpoint"] = "ckpt/step_8.pt"
    config = config_from_dict(data, tmp_path / "sub" / "gate.yaml")
    assert config.policy is not None
    assert config.policy.checkpoint == (tmp_path / "sub" / "ckpt" / "step_8.pt").resolve()
    data["policy"]["checkpoint"] = ""  # Path("") would be the config's own folder
    line = _bad(data, tmp_path)
    assert "policy.checkpoint" in line and "empty path" in line


def test_config_missing_section_and_unknown_threshold(tmp_path: Path) -> None:
    assert "policy" in _bad({"name": "x", "family": "policy"}, tmp_path)
    data = json.loads(json.dumps(POLICY))
    data["thresholds"] = {"logits_agreement": {"max_abs_dif": 1.0}}
    assert "thresholds.logits_agreement.max_abs_dif" in _bad(data, tmp_path)
    data["thresholds"] = {"no_such_check": {}}
    assert "thresholds.no_such_check" in _bad(data, tmp_path)


def test_config_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(InputError) as err:
        load_config(p)
    assert "bad.yaml" in err.value.line() and "invalid YAML" in err.value.line()
    with pytest.raises(InputError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_committed_configs_validate() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.name == path.stem


def test_import_paritygate_is_light() -> None:
    code = (
        "import sys, paritygate, paritygate.config, paritygate.gate, paritygate.cli\n"
        "names = ('torch', 'onnxruntime', 'transformers', 'vllm')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_junit_and_summary_shape() -> None:
    results = [
        CheckResult("a", "pass", "ok", {"x": 1.0}, {"x": 1.0}, {"x": 2.0}, "x"),
        CheckResult("b", "fail", "bad thing", {"y": 3.0}, None, {}, None),
        CheckResult("c", "skip", "no gpu", {}, None, {}, None),
    ]
    data = {"name": "n", "checks": [r.to_json() for r in results]}
    root = ET.fromstring(junit_xml(data).split("\n", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None
    assert (
        suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    )
    lines = summary_table(results)
    assert lines[0] == "root cause: b"
    assert lines[1].split() == ["check", "status", "key", "metric", "value", "threshold", "golden"]
    assert lines[3].startswith("b ") and lines[4].startswith("a "), "failing checks first"
    assert any(line.startswith("b: bad thing") for line in lines)


def test_gate_marks_match_check_specs() -> None:
    from paritygate.checks import CHECK_IDS, get_check

    for cid in CHECK_IDS:
        text = (REPO / "gates" / f"test_{cid}.py").read_text()
        for mark in get_check(cid).marks:
            assert f"@pytest.mark.{mark}" in text, (cid, mark)


def test_regression_against_a_baseline_of_other_numerics_says_so(tmp_path: Path) -> None:
    from paritygate.golden import regression_check

    store = GoldenStore(tmp_path / "golden")
    fp32 = {"serving dtype": "float32", "training dtype": "float32"}
    bf16 = {**fp32, "serving dtype": "bfloat16"}

    def check(value: float, numerics: dict[str, str], blessing: bool = False) -> CheckResult:
        return regression_check(
            _measurement(value), store, margin=Margin(), blessing=blessing,
            probes_sha256=lambda: "p", provenance=lambda: {"numerics": fp32},
            bless_command="bless", numerics=lambda: numerics,
        )  # fmt: skip

    assert check(0.1, fp32, blessing=True).status == "pass"
    moved = check(0.9, bf16)
    assert moved.status == "fail"
    assert "blessed with other numerics (serving dtype float32 -> bfloat16)" in moved.message
    assert moved.fix is not None and "golden.baseline" in moved.fix
    same = check(0.9, fp32)  # the same regression under the blessed numerics: no excuse offered
    assert same.status == "fail" and "numerics" not in same.message


def test_thresholds_keep_defaults_and_overrides_apart() -> None:
    from paritygate.check import Thresholds

    t = Thresholds({"a": 1.0, "b": 2.0}, {"a": 0.5, "b": None, "c": 3.0})
    assert dict(t) == {"a": 0.5, "b": 2.0, "c": 3.0}  # a null keeps the default for diagnostics
    assert t.is_set("a") and t.is_set("b") and not Thresholds({"a": 1.0}).is_set("a")
    assert t.informational == {"b"}
    assert t.defaults == {"a": 1.0, "b": 2.0}
