"""``vllm_delta`` runs only when asked for: the config's engines list vLLM, its ``checks:``
names the check, or the run selects it (``-m vllm``, ``--check vllm_delta``). A config on the HF
engine skips it saying so, and never starts vLLM (minutes on CPU), vLLM installed or not.

The HF engine stands in for vLLM (as in test_lm_inputs.py), so both sides run without vLLM;
test_vllm_real.py runs the asked-for case on the real engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lm_zoo import clean_config

import paritygate.checks.vllm_delta as vllm_delta
from paritygate.check import selects_by_marks
from paritygate.checks import get_check


class Unstartable:
    """An engine named vllm that must not be used: the run fails if anything generates."""

    name = "vllm"

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise AssertionError("vLLM was started for a config that did not ask for it")


def _stand_in(ctx: Any) -> Any:
    """The context's HF engine under vLLM's name."""
    from paritygate.engines.hf_generate import HFGenerateEngine

    hf = ctx.engines["hf"]
    engine = HFGenerateEngine(
        hf.model, pad_token_id=hf.pad_token_id, eos_token_id=hf.eos_token_id,
        tokenizer=hf.tokenizer,
    )
    engine.name = "vllm"
    return engine


@pytest.mark.parametrize(
    ("markexpr", "selects"),
    [(None, False), ("", False), ("vllm", True), ("gpu", True), ("fast or vllm", True),
     ("vllm and not slow", True), ("not fast", False), ("not vllm", False), ("fast", False),
     ("((", False)],
)
def test_selects_by_marks(markexpr: str | None, selects: bool) -> None:
    assert selects_by_marks(markexpr, get_check("vllm_delta").marks) is selects


def test_named_checks_from_the_command_line() -> None:
    """``paritygate run --check vllm_delta`` hands pytest the gate file's node; a gate file
    given to pytest names its check too; a folder names none."""
    from paritygate.plugin import _named_checks

    assert _named_checks(["/x/gates/test_vllm_delta.py::test_vllm_delta"]) == {"vllm_delta"}
    assert _named_checks(["gates/test_vllm_delta.py", "gates"]) == {"vllm_delta"}
    assert _named_checks(["gates", "tests/test_other.py"]) == frozenset()


def test_hf_config_skips_vllm_delta_saying_so(lm_variants, monkeypatch) -> None:
    gate = lm_variants.gate("clean")  # engines: [hf]
    engine = Unstartable()
    monkeypatch.setitem(gate.context.engines.__dict__, "vllm", engine)  # its cached_property
    monkeypatch.setattr(vllm_delta, "unavailable_reason", lambda model_dir=None: None)
    for markexpr in (None, "not fast", "not gpu"):
        monkeypatch.setattr(gate, "markexpr", markexpr)
        result = gate.evaluate("vllm_delta", golden=False)
        assert result.status == "skip", result.message
        assert "asks for vLLM" in result.message and "engines is [hf]" in result.message
        assert "-m vllm" in result.message
    assert engine.calls == 0


@pytest.mark.parametrize("how", ["-m vllm", "-m gpu", "--check", "checks:", "engines"])
def test_asked_for_vllm_delta_runs(lm_variants, vllm_variants, monkeypatch, how: str) -> None:
    gate = (vllm_variants if how == "engines" else lm_variants).gate("clean")
    if how.startswith("-m"):
        monkeypatch.setattr(gate, "markexpr", how.split()[1])
    elif how == "--check":
        monkeypatch.setattr(gate, "named", frozenset({"vllm_delta"}))
    elif how == "checks:":
        listed = gate.config.model_copy(update={"checks": ["vllm_delta"]})
        monkeypatch.setattr(gate, "config", listed)
    monkeypatch.setitem(gate.context.engines.__dict__, "vllm", _stand_in(gate.context))
    monkeypatch.setattr(vllm_delta, "unavailable_reason", lambda model_dir=None: None)
    result = gate.evaluate("vllm_delta", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["n_tokens"] > 0


def test_hf_run_passes_without_starting_vllm(demo_lm: Path, tmp_path: Path) -> None:
    """The CLI on an HF-engine config whose run includes vllm_delta (nothing names it): exit 0
    on its other check, vllm_delta skipped with the reason, in no time (vLLM, when installed,
    is never started)."""
    from paritygate.checks import checks_for

    data = clean_config(demo_lm)
    data["name"] = "hf-only"
    data["skip_checks"] = [
        c.id for c in checks_for("causal_lm") if c.id not in ("sampling_config", "vllm_delta")
    ]
    data["golden"] = {"dir": str(tmp_path / "golden")}
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    command = [sys.executable, "-m", "paritygate", "run", str(config),
               "--report-dir", str(tmp_path / "report")]
    bless = subprocess.run([*command, "--update-golden"], capture_output=True, text=True,
                           timeout=600)
    assert bless.returncode == 0, bless.stdout + bless.stderr
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["sampling_config"]["status"] == "pass"
    assert checks["vllm_delta"]["status"] == "skip"
    assert not (tmp_path / "golden" / "hf-only" / "vllm_delta.json").exists()
    assert "asks for vLLM" in checks["vllm_delta"]["message"]
    assert "vllm_delta" in run.stdout and "Traceback" not in run.stdout + run.stderr
