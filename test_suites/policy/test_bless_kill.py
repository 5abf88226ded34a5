"""A bless killed with SIGKILL leaves golden usable: every golden JSON file is the old or the
new content (whole, valid JSON), no temp file is left that git would add, the next run passes.

The kills land at several points of the bless: while inputs load (nothing written yet), as
the first golden file changes, and a little later (files being replaced one by one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from policy_zoo import base_config

REPO = Path(__file__).resolve().parents[2]
NAME = "demo-policy"


def _cli(config: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    return subprocess.Popen([sys.executable, "-m", "paritygate", "run", str(config), *args],
                            cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _snapshot(golden: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(golden.iterdir()) if p.is_file()}


def _kill_during_bless(config: Path, golden: Path, old: dict[str, bytes], delay: float | None,
                       ) -> None:
    """Start a bless; SIGKILL it ``delay`` s after the first golden file changes (``None``:
    while it loads its inputs, before any write)."""
    stamps = {p: p.stat().st_mtime_ns for p in golden.iterdir()}
    proc = _cli(config, "--update-golden")
    try:
        if delay is None:
            time.sleep(3.0)
        else:
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                now = {p: p.stat().st_mtime_ns for p in golden.iterdir() if p.exists()}
                if now != stamps:
                    break
                time.sleep(0.005)
            time.sleep(delay)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def _assert_old_or_new(golden: Path, old: dict[str, bytes]) -> None:
    for path in sorted(golden.iterdir()):
        data = path.read_bytes()
        if path.name.endswith(".tmp"):
            continue  # judged by git below
        record = json.loads(data)  # never partial
        assert isinstance(record, dict) and isinstance(record.get("metrics"), dict), path.name
        if path.name in old and data != old[path.name]:
            assert set(record) == set(json.loads(old[path.name])), path.name  # a whole new record


def _git_would_add(repo: Path) -> list[str]:
    out = subprocess.run(["git", "add", "--dry-run", "-A", "."], cwd=repo, capture_output=True,
                         text=True, check=True).stdout
    return [line.split("'")[1] for line in out.splitlines() if line.startswith("add '")]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_during_bless_leaves_golden_whole(clean_demo: Path, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(REPO / ".gitignore", tmp_path / ".gitignore")
    data = base_config(clean_demo)
    data["golden"] = {**data["golden"], "dir": "golden"}
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    golden = tmp_path / "golden" / NAME

    first = _cli(config, "--update-golden")
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, out + err
    old = _snapshot(golden)
    assert len(old) >= 7

    for delay in (None, 0.0, 0.02, 0.3):
        _kill_during_bless(config, golden, old, delay)
        _assert_old_or_new(golden, old)
        added = [p for p in _git_would_add(tmp_path) if p.startswith("golden/")]
        assert all(p.endswith(".json") and not Path(p).name.startswith(".") for p in added), added
        assert {Path(p).name for p in added} == set(old), added

    after = _cli(config)
    out, err = after.communicate(timeout=900)
    assert after.returncode == 0, out + err
    assert not err.strip(), err
