"""The report contract: strict JSON with schema_version, timestamp and git commit, the
published schemas, root cause first, one sentence per failure, JUnit at full precision."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import pytest

from paritygate.report import junit_xml, report_json, summary_table, validate_report, write_reports
from paritygate.report.model import schema_texts
from paritygate.result import CheckResult, Measurement
from paritygate.rootcause import explain
from paritygate.verdict import Margin, judge

REPO = Path(__file__).resolve().parents[1]


def _reject(token: str) -> None:
    raise ValueError(f"bare {token}")


def _gate(tmp: Path, name: str = "unit") -> SimpleNamespace:
    (tmp / "ckpt").mkdir(parents=True, exist_ok=True)
    ckpt = tmp / "ckpt" / "policy.safetensors"
    ckpt.write_bytes(b"x")
    config = SimpleNamespace(name=name, family="policy", path=tmp / "gate.yaml")
    ctx = SimpleNamespace(checkpoint_path=ckpt, checkpoint_sha256="ab" * 32)
    return SimpleNamespace(config=config, context=ctx)


def _weights_nan() -> CheckResult:
    m = Measurement("weights_load")
    m.fail("nonfinite_checkpoint", "checkpoint tensor 'trunk.4.weight' has 1 NaN/Inf values")
    m.metric("missing_keys", 0, key=True, ratchet=False)
    m.metric("nonfinite_tensors", 1, ratchet=False)
    return judge(m, None, use_golden=False)


def _logits(value: float, finding: bool = True) -> CheckResult:
    m = Measurement("logits_agreement")
    m.metric("max_abs_diff", value, threshold=2e-5, key=True)
    m.metric("kl_max", value, threshold=1e-6)
    if finding:
        m.fail("artifact_outputs_differ", f"artifact logits differ by up to {value:.3g}; stale "
               "artifact, low-precision layer or changed output scaling", metric="max_abs_diff")
    return judge(m, None, use_golden=False)


def _stale() -> CheckResult:
    m = Measurement("export_integrity")
    m.fail("stale_manifest",
           "stale artifact: manifest says it was exported from checkpoint sha256 c395553b59e0")
    m.metric("stale_checkpoint", 1, threshold=0, key=True)
    return judge(m, None, use_golden=False)


def _passing(cid: str = "dropout_off") -> CheckResult:
    m = Measurement(cid)
    m.metric("torch_repeat_max_abs_diff", 0.0, threshold=1 / 3, key=True)
    return judge(m, {"metrics": {"torch_repeat_max_abs_diff": 0.1 + 0.2}})


def test_published_schemas_are_regenerated_files() -> None:
    for name, text in schema_texts().items():
        committed = (REPO / "schemas" / name).read_text(encoding="utf-8")
        assert committed == text, (
            f"schemas/{name} is stale: python -m paritygate.report.schemagen schemas")


def test_report_json_is_strict_with_nonfinite_markers(tmp_path: Path) -> None:
    results = [_weights_nan(), _logits(float("nan")), _passing()]
    data = report_json(_gate(tmp_path), results)
    text = json.dumps(data, allow_nan=False)
    parsed = json.loads(text, parse_constant=_reject)
    logits = next(c for c in parsed["checks"] if c["id"] == "logits_agreement")
    assert logits["metrics"]["max_abs_diff"] == {"value": None, "nonfinite": "nan"}
    assert parsed["schema_version"] == "1.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", parsed["generated_at"])
    assert parsed["git_commit"] is None  # tmp_path is not inside a git repository
    assert parsed["counts"] == {"total": 3, "pass": 1, "fail": 2, "error": 0, "skip": 0}
    validate_report(parsed)


def test_validation_rejects_bare_nan_and_unknown_fields(tmp_path: Path) -> None:
    data = report_json(_gate(tmp_path), [_passing()])
    bad = json.loads(json.dumps(data))
    bad["checks"][0]["metrics"]["x"] = math.nan
    with pytest.raises(ValueError):
        validate_report(bad)
    extra = json.loads(json.dumps(data))
    extra["surprise"] = 1
    with pytest.raises(ValueError, match="schema"):
        validate_report(extra)


def test_paths_relative_to_config_and_git_commit(tmp_path: Path) -> None:
    repo = tmp_path / "train-repo"
    gate = _gate(repo / "gates")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "gates" / "gate.yaml").write_text("name: unit\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "init"], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    data = report_json(gate, [_passing()])
    assert data["git_commit"] == head
    assert data["config"] == "gates/gate.yaml"
    assert data["checkpoint"]["path"] == "ckpt/policy.safetensors"
    assert data["checkpoint"]["path_abs"] == str((repo / "gates/ckpt/policy.safetensors")
                                                 .resolve())
    validate_report(data)


def test_root_cause_leads_and_consequences_say_see(tmp_path: Path) -> None:
    logits = _logits(8e-4)
    results = [_passing("weights_load"), logits, _stale()]
    explained, cause = explain(results)
    assert cause is not None and cause.check == "export_integrity"
    assert cause.kind == "stale_artifact" and cause.explains == ("logits_agreement",)
    by_id = {r.id: r for r in explained}
    msg = by_id["logits_agreement"].message
    assert msg.startswith("see export_integrity: the artifact was not exported")
    assert "low-precision" not in msg and "max_abs_diff 0.0008 (threshold 2e-05)" in msg
    assert by_id["logits_agreement"].metrics == logits.metrics  # own metrics kept
    assert logits.consequence_of is None, "explain returns copies"
    again, cause2 = explain(explained)
    assert [r.message for r in again] == [r.message for r in explained] and cause2 == cause
    lines = summary_table(results)
    assert lines[0] == "root cause: export_integrity (explains logits_agreement)"
    order = [line.split()[0] for line in lines[3:6]]
    assert order == ["export_integrity", "logits_agreement", "weights_load"]


def test_nan_checkpoint_key_metric_is_the_failing_one() -> None:
    r = _weights_nan()
    assert r.status == "fail" and r.key_metric == "nonfinite_tensors"
    assert r.message == "checkpoint tensor 'trunk.4.weight' has 1 NaN/Inf values."


def test_one_sentence_per_failure_no_semicolon_runs() -> None:
    m = Measurement("logits_agreement")
    m.metric("max_abs_diff", 0.5, threshold=2e-5, key=True)
    r = judge(m, {"metrics": {"max_abs_diff": 1e-6}})
    assert r.message == "max_abs_diff 0.5 is above the threshold 2e-05 and regressed from the " \
                        "golden 1e-06."
    assert r.cause == r.message and r.failed_metrics == ["max_abs_diff"]
    assert len(r.reasons) == 2  # both rules stay on record


def test_tightened_threshold_drops_the_generic_hint() -> None:
    m = Measurement("logits_agreement")
    m.metric("max_abs_diff", 3e-6, threshold=1e-6, key=True)
    m.fail("artifact_outputs_differ", "artifact logits differ by up to 3e-06; stale artifact, "
           "low-precision layer or changed output scaling", metric="max_abs_diff")
    r = judge(m, {"metrics": {"max_abs_diff": 3.1e-6}})
    assert r.status == "fail"
    assert "stale artifact" not in r.message and "tightened" in r.message
    assert r.fix is not None and "thresholds.logits_agreement.max_abs_diff" in r.fix
    without_golden = judge(m, None, use_golden=False)  # no baseline: the hint stays
    assert "stale artifact" in without_golden.message


def test_golden_inside_the_threshold_is_not_called_a_tightened_threshold() -> None:
    # golden 1 meets a threshold of 1; today's 0.8 moved within the regression margin
    m = Measurement("logits_agreement")
    m.metric("topk_overlap_min", 0.8, bad="lower", threshold=1.0, key=True)
    r = judge(m, {"metrics": {"topk_overlap_min": 1.0}}, margin=Margin(rel_margin=0.5))
    assert r.status == "fail"
    assert "tightened" not in r.message
    assert "topk_overlap_min 0.8 is below the threshold 1" in r.message


def test_junit_has_threshold_and_golden_at_full_precision(tmp_path: Path) -> None:
    data = report_json(_gate(tmp_path), [_passing()])
    root = ET.fromstring(junit_xml(data).split("\n", 1)[1])
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["torch_repeat_max_abs_diff.threshold"] == repr(1 / 3)
    assert props["torch_repeat_max_abs_diff.golden"] == repr(0.1 + 0.2)


def test_html_and_markdown_lead_with_the_root_cause(tmp_path: Path, monkeypatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/train")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    out = tmp_path / "reports"
    written = write_reports(_gate(tmp_path), [_passing(), _logits(8e-4), _stale()], out,
                            formats=frozenset({"json", "md", "html", "junit"}))
    assert written.root_cause == "export_integrity"
    html = (out / "report.html").read_text()
    assert html.index("Root cause") < html.index("<table>")
    assert html.index('href="#export_integrity"') < html.index('href="#dropout_off"')
    assert 'class="breach">0.0008<' in html
    assert "|---|" not in html and "**" not in html, "Markdown pasted into the HTML"
    md = (out / "report.md").read_text()
    assert "1 passed, 2 failed of 3 checks" in md
    assert "https://github.com/acme/train/actions/runs/42" in md
    assert md.index("Root cause: `export_integrity`") < md.index("| check |")
    assert "| **1** |" in md  # breaching key-metric cell in bold
    assert summary.read_text() == md
    data = json.loads((out / "report.json").read_text(), parse_constant=_reject)
    assert data["artifact_url"] == "https://github.com/acme/train/actions/runs/42"
    validate_report(data)


def test_lm_delta_plots_embedded(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    m = Measurement("logprob_delta")
    m.metric("delta_max_abs", 0.05, threshold=0.02, key=True)
    m.details["per_token"] = [{"seq": s, "pos": p, "delta": 0.01 * ((s + p) % 5 - 2)}
                              for s in range(4) for p in range(12)]
    r = judge(m, None, use_golden=False)
    write_reports(_gate(tmp_path), [r], tmp_path / "r",
        formats=frozenset({"json", "md", "html", "junit"}))
    html = (tmp_path / "r" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "delta histogram" in html and "delta per position" in html


def test_templates_ship_as_package_data() -> None:
    from importlib import resources

    files = resources.files("paritygate.report") / "templates"
    assert {"report.md.j2", "report.html.j2"} <= {p.name for p in files.iterdir()}
    assert '"paritygate.report.templates" = ["*.j2"]' in (REPO / "pyproject.toml").read_text()
