"""A config-only check starts without torch: ``paritygate run CONFIG --check sampling_config``
builds the LM family's config-only context (sampling configs, ``config.json``, tokenizer facts
from the tokenizer's files) in a process that never imports torch or transformers, and still
measures: the clean demo passes, a serving temperature that differs fails by its kind, and the
record equals the full context's. So does a run whose serving engine is vLLM (what vLLM
applies from a served generation_config.json is read without transformers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lm_zoo import (
    FAULTS,
    SAMPLING_VARIANTS,
    served_hf_defaults_vllm,
    served_temperature_vllm,
    variant_config,
)

WRAPPER = """
import json, sys
from paritygate.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(
    m for m in ("torch", "transformers", "vllm") if m in sys.modules)}))
"""


def _run(demo_lm: Path, out: Path, fault: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    found = next((f for f in FAULTS + SAMPLING_VARIANTS if f.name == fault), None)
    data = variant_config(demo_lm, out, found)
    if fault in SERVED_VLLM:  # a served generation_config.json, engines: [vllm]
        SERVED_VLLM[fault](data, demo_lm, out)
    data["name"] = "config-only"
    data["golden"] = {"dir": str(out / "golden")}
    (out / "gate.yaml").write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, "run", str(out / "gate.yaml"), "--check",
         "sampling_config", "--update-golden", "--report-dir", str(out / "report")],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    ended = json.loads(proc.stdout.strip().splitlines()[-1])
    report = json.loads((out / "report" / "report.json").read_text())
    return ended, next(c for c in report["checks"] if c["id"] == "sampling_config")


SERVED_VLLM = {"served_temperature_vllm": served_temperature_vllm,
               "served_hf_defaults_vllm": served_hf_defaults_vllm}
"""Under ``engines: [vllm]``, vLLM's reading of the served generation_config.json (which
drops transformers' ``GenerationConfig`` defaults) is still config-only."""


@pytest.mark.parametrize(("fault", "code", "kinds"), [
    (None, 0, []),
    ("temperature_differs", 1, ["field_differs"]),
    ("served_temperature_vllm", 1, ["field_differs"]),
    ("served_hf_defaults_vllm", 0, []),
])
def test_sampling_config_runs_without_torch(demo_lm: Path, tmp_path: Path, fault: str | None,
                                            code: int, kinds: list[str]) -> None:
    ended, record = _run(demo_lm, tmp_path, fault)
    assert ended == {"code": code, "loaded": []}
    assert record["status"] == ("pass" if code == 0 else "fail"), record["message"]
    assert sorted({r["finding"] for r in record["reasons"] if r["finding"]}) == kinds, record


@pytest.mark.parametrize("name", ["clean", "temperature_differs", "repetition_penalty_both"])
def test_config_only_context_measures_as_the_full_one(demo_lm: Path, tmp_path: Path,
                                                      lm_variants: Any, name: str) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    found = next((f for f in FAULTS + SAMPLING_VARIANTS if f.name == name), None)
    data = variant_config(demo_lm, tmp_path, found)
    data["name"] = "config-only"
    gate = Gate(config_from_dict(data, tmp_path / "gate.yaml"))
    gate.named = frozenset({"sampling_config"})
    obtained = gate.evaluate("sampling_config", golden=False)
    expected = lm_variants.evaluate(name, "sampling_config")
    assert gate.threads is None  # the config-only context: no model runs
    assert (obtained.status, obtained.finding_kinds()) == (expected.status,
                                                           expected.finding_kinds())
    assert obtained.details["fields"] == expected.details["fields"]


def test_tokenizer_facts_equal_hf(demo_lm: Path) -> None:
    from transformers import AutoTokenizer

    from paritygate.families.causal_lm.config_only import TokenizerFiles

    facts = TokenizerFiles.read(demo_lm)
    hf = AutoTokenizer.from_pretrained(demo_lm)
    assert facts is not None
    for name in ("eos_token", "eos_token_id", "bos_token", "bos_token_id", "pad_token",
                 "pad_token_id", "padding_side", "truncation_side", "chat_template"):
        assert getattr(facts, name) == getattr(hf, name), name
    assert facts.get_vocab() == hf.get_vocab() and len(facts) == len(hf)
