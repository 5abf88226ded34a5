"""report.json: the machine-readable contract (schema in :mod:`paritygate.report.model`)."""

from __future__ import annotations

import math
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from paritygate.report.model import SCHEMA_VERSION
from paritygate.result import CheckResult
from paritygate.rootcause import bless_hint, explain

NOTHING_VERIFIED = "nothing_verified"


def overall_status(results: list[CheckResult], *, allow_skips: bool = False) -> str:
    """``fail`` on any failure; ``nothing_verified`` when no check passed (every selected
    check skipped, or none selected) unless the caller opted in with ``allow_skips``."""
    if any(r.status in ("fail", "error") for r in results):
        return "fail"
    if not any(r.status == "pass" for r in results) and not allow_skips:
        return NOTHING_VERIFIED
    return "pass"


def nothing_verified_reason(results: list[CheckResult]) -> str:
    """Why a run verified nothing, for the one line the CLI prints."""
    if not results:
        return "nothing was verified: no check was selected"
    skipped = "; ".join(f"{r.id}: {r.message}" for r in results)
    return f"nothing was verified: every selected check skipped: {skipped}"


def counts(results: list[CheckResult]) -> dict[str, int]:
    out = {"total": len(results), "pass": 0, "fail": 0, "error": 0, "skip": 0}
    for r in results:
        out[r.status] += 1
    return out


def strict(value: Any) -> Any:
    """``value`` with every NaN/Inf replaced by ``{"value": null, "nonfinite": ...}``."""
    if isinstance(value, float) and not math.isfinite(value):
        kind = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return {"value": None, "nonfinite": kind}
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return strict(value.item())
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def git_info(folder: Path, timeout: float = 5.0) -> tuple[Path | None, str | None]:
    """(top level, HEAD commit) of the git repository holding ``folder``; ``(None, None)``
    outside one, without git, or when git does not answer within ``timeout`` seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True, text=True, timeout=timeout, check=False, env=env,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2:
        return None, None
    return Path(lines[0]), lines[1]


def relative(path: Path, *bases: Path | None) -> str:
    """``path`` relative to the first base that holds it, else absolute."""
    path = Path(path).resolve()
    for base in bases:
        if base is None:
            continue
        try:
            return path.relative_to(Path(base).resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def artifact_url() -> str | None:
    """The CI run's page, where the uploaded report artifact lives (GitHub Actions)."""
    server, repo, run = (os.environ.get(k) for k in
                         ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        return f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
    return None


def report_json(
    gate: Any, results: list[CheckResult], *, not_run: list[str] | None = None
) -> dict[str, Any]:
    """The report.json mapping of a run: strict JSON, root cause first in ``root_cause``.

    ``not_run``: selected checks a stopped run (``-x``) never reached; the root cause is
    chosen among the checks that ran, and the report says which did not."""
    from paritygate.provenance import environment

    ctx = gate.context
    config_path = Path(gate.config.path).resolve()
    top, commit = git_info(config_path.parent)
    explained, cause = explain(results)
    checkpoint = Path(ctx.checkpoint_path)
    data = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "name": gate.config.name,
        "status": overall_status(results, allow_skips=getattr(gate, "allow_skips", False)),
        "family": gate.config.family,
        "counts": counts(results),
        "root_cause": cause.to_json() if cause is not None else None,
        "bless_hint": bless_hint(results),
        "config": relative(config_path, top) if top else config_path.name,
        "config_abs": str(config_path),
        "git_commit": commit,
        "artifact_url": artifact_url(),
        "checkpoint": {
            "path": relative(checkpoint, config_path.parent, top),
            "path_abs": str(checkpoint.resolve()),
            "sha256": ctx.checkpoint_sha256,
            **_trainer_record(gate.config),
        },
        "environment": {k: str(v) for k, v in environment().items()},
        "checks": [r.to_json() for r in explained],
    }
    if not_run:
        data["not_run"] = list(not_run)
    return strict(data)


def _trainer_record(config: Any) -> dict[str, Any]:
    """``{"trainer": {...}}`` when the checkpoint came from a trainer's output folder."""
    record = getattr(config, "trainer_checkpoint", None)
    return {"trainer": record.to_json()} if record is not None else {}
