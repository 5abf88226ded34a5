"""Snapshot of a demo gate's report.json, held across refactors.

The demo gates are run through the library on the session's demo builds, and their
report.json (durations, environment and machine paths left out) is compared with the
file in ``test_suites/snapshots/``: byte for byte on the machine that wrote it; elsewhere
the report's contract exactly and, for the same checkpoint, every number to 1e-4 relative
(other CPU kernels move the last digits; another checkpoint moves every number). A
deliberate change of the report regenerates it:
``PARITYGATE_REGEN_SNAPSHOTS=1 python -m pytest test_suites -k report_snapshot``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
VARYING = ("duration_s", "generated_at", "git_commit", "artifact_url", "platform")
"""Fields that vary between runs of the same gate (left out of the snapshot)."""


def _strip(data: Any, roots: dict[str, str]) -> Any:
    if isinstance(data, dict):
        return {k: _strip(v, roots) for k, v in data.items() if k not in VARYING}
    if isinstance(data, list):
        return [_strip(v, roots) for v in data]
    if isinstance(data, str):
        for root, name in roots.items():
            data = data.replace(root, name)
    return data


def demo_config(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``configs/<name>.yaml`` with the demo paths replaced and the repository's golden."""
    data = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text(encoding="utf-8"))
    data["golden"]["dir"] = str(REPO / "golden")
    for dotted, value in overrides.items():
        section = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            section = section[part]
        section[leaf] = value
    return data


def normalised_report(config: dict[str, Any], config_path: Path, roots: dict[str, str]) -> str:
    """report.json of a gate over ``config`` as the snapshot stores it."""
    from paritygate.files import dump_json
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict
    from paritygate.report import report_json

    gate = Gate(config_from_dict(config, config_path))
    from paritygate.report import validate_report

    data = report_json(gate, gate.run())
    validate_report(data)
    data.pop("environment", None)
    roots = {str(config_path.parent): "<config-dir>", str(REPO): "<repo>", **roots}
    return dump_json(_strip(json.loads(dump_json(data)), roots))


def contract_view(data: dict[str, Any]) -> dict[str, Any]:
    """What a report promises whatever the floating-point kernels: the gate's and each check's
    status, key and failing metric names, the metric and golden names, and the messages'
    wording (numbers masked)."""

    def words(text: Any) -> Any:
        return re.sub(r"[-+]?\d[\d.eE+-]*", "<n>", text) if isinstance(text, str) else text

    return {
        "name": data["name"],
        "status": data["status"],
        "counts": data["counts"],
        "root_cause": (data.get("root_cause") or {}).get("check"),
        "checks": [
            {
                "id": c["id"],
                "status": c["status"],
                "key_metric": c["key_metric"],
                "failed_metrics": c["failed_metrics"],
                "metrics": sorted(c["metrics"]),
                "golden": sorted(c["golden"] or {}),
                "message": words(c["message"]),
                "consequence_of": c["consequence_of"],
            }
            for c in data["checks"]
        ],
    }


def assert_matches_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / f"{name}.report.json"
    if os.environ.get("PARITYGATE_REGEN_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(text, encoding="utf-8")
        assert os.environ.get("PARITYGATE_REGEN_SNAPSHOTS") == "1", (
            f"no snapshot {path.name}: written now, commit it")
        return
    expected = path.read_text(encoding="utf-8")
    if text == expected:
        return
    obtained_data, expected_data = json.loads(text), json.loads(expected)
    hint = ("if the change is deliberate: PARITYGATE_REGEN_SNAPSHOTS=1 python -m pytest "
            "test_suites -k report_snapshot")
    # Another machine: its CPU kernels move the last digits (same checkpoint), or train the
    # demo to another checkpoint (other sha256) whose numbers differ by construction.
    assert contract_view(obtained_data) == contract_view(expected_data), (
        f"report.json of {name} breaks the contract of {path.relative_to(REPO)}; {hint}")
    if obtained_data["checkpoint"]["sha256"] == expected_data["checkpoint"]["sha256"]:
        assert _close(obtained_data, expected_data), (
            f"report.json of {name} differs from {path.relative_to(REPO)} beyond the last "
            f"digits; {hint}")


def _close(obtained: Any, expected: Any, rel: float = 1e-4, abs_: float = 1e-9) -> bool:
    """Equal up to floating-point digits (and numbers inside strings masked)."""
    if isinstance(obtained, dict) and isinstance(expected, dict):
        return obtained.keys() == expected.keys() and all(
            _close(obtained[k], expected[k], rel, abs_) for k in obtained
        )
    if isinstance(obtained, list) and isinstance(expected, list):
        return len(obtained) == len(expected) and all(
            _close(o, e, rel, abs_) for o, e in zip(obtained, expected, strict=True)
        )
    if isinstance(obtained, float) or isinstance(expected, float):
        if not isinstance(obtained, (int, float)) or not isinstance(expected, (int, float)):
            return False
        return abs(obtained - expected) <= max(abs_, rel * max(abs(obtained), abs(expected)))
    if isinstance(obtained, str) and isinstance(expected, str):
        mask = r"[-+]?\d[\d.eE+-]*"
        return re.sub(mask, "<n>", obtained) == re.sub(mask, "<n>", expected)
    return obtained == expected
