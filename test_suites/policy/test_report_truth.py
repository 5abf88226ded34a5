"""A report never claims more than was verified, on the demo policy: interrupts at a check
boundary and inside a check, a full disk while golden or the report is written, report and
golden folders behind dangling links, concurrent blesses of one baseline, and a checkpoint
larger than memory. Each ends with its exit code and one stderr line, the previous report
and golden unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_zoo import base_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_contract import Case, run_here
from measured_run import cpu_seconds_now, read_bytes_now

pytestmark = pytest.mark.xdist_group("report-truth")

NAME = "demo-policy"


def _digest(folder: Path) -> dict[str, str]:
    """Every baseline's sha256 (the bless lock, which names its holder's pid, is no baseline)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(".bless.lock")}


def _config(root: Path, data: dict[str, Any], name: str = "gate.yaml") -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def _popen(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "paritygate", "run", str(config), *args],
                            cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())


@pytest.fixture(scope="module")
def failing(clean_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gate blessed clean, then tightened so logits_agreement fails: its last report is a
    ``fail`` (what an interrupted run must never overwrite with a ``pass``)."""
    root = tmp_path_factory.mktemp("report-truth")
    data = base_config(clean_demo)
    data["golden"] = {**data["golden"], "dir": str(root / "golden")}
    data["report_dir"] = str(root / "reports")
    blessed = subprocess.run([sys.executable, "-m", "paritygate", "run",
                              str(_config(root, data, "clean.yaml")), "--update-golden"],
                             capture_output=True, text=True, env=_env(), timeout=600)
    assert blessed.returncode == 0, blessed.stdout + blessed.stderr
    data["thresholds"] = {"logits_agreement": {"max_abs_diff": 1e-9}}
    config = _config(root, data)
    first = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config)],
                           capture_output=True, text=True, env=_env(), timeout=600)
    assert first.returncode == 1, first.stdout + first.stderr
    return config


def _assert_interrupted(code: int, err: str, expected: int, before: dict[str, str],
                        after: dict[str, str]) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected, (code, err[-2000:])
    assert len(lines) == 1 and "interrupted" in lines[0] and "no report written" in lines[0], err
    assert after == before  # the fail report and golden, byte for byte


@pytest.mark.parametrize(("at", "sig", "expected"), [
    (1, "SIGINT", 130), (4, "SIGINT", 130), (7, "SIGINT", 130), (3, "SIGTERM", 143),
])
def test_a_signal_at_a_check_boundary_writes_no_report(failing: Path, at: int, sig: str,
                                                       expected: int) -> None:
    """The signal is sent as the at-th check's result line is printed (a check boundary)."""
    root = failing.parent
    before = _digest(root / "reports") | _digest(root / "golden")
    proc = _popen(failing)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("[paritygate]")
        if seen == at:
            proc.send_signal(getattr(signal, sig))
            break
    _, err = proc.communicate(timeout=300)
    _assert_interrupted(proc.returncode, err, expected, before,
                        _digest(root / "reports") | _digest(root / "golden"))


def _interrupting(monkeypatch: pytest.MonkeyPatch, check_id: str, action: Any) -> None:
    """Make ``check_id``'s policy measure call ``action()`` before it measures."""
    from paritygate.checks import get_check

    spec = get_check(check_id)
    measure = spec.measures["policy"]

    def interrupted(ctx: Any, thresholds: Any) -> Any:
        action()
        return measure(ctx, thresholds)

    monkeypatch.setitem(spec.measures, "policy", interrupted)


def _sigint_mid_check() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a real signal, delivered while the check runs
    time.sleep(5)  # the handler raises here
    raise AssertionError("SIGINT was not delivered")


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("action", [_sigint_mid_check, _raise_keyboard_interrupt],
                         ids=["sigint-mid-check", "keyboard-interrupt-in-check"])
def test_an_interrupt_inside_a_check_writes_no_report(
    failing: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    action: Any,
) -> None:
    root = failing.parent
    before = _digest(root / "reports") | _digest(root / "golden")
    _interrupting(monkeypatch, "head_removal", action)
    code, _, err = run_here(Case("mid", failing, "", None), capfd)
    _assert_interrupted(code, err, 130, before,
                        _digest(root / "reports") | _digest(root / "golden"))


def test_an_interrupt_that_a_plugin_fails_on_still_writes_no_report(
    failing: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    """pytest's terminal reporter can raise while formatting the interrupted frame; the
    session then finishes with exit status 0. The run is still interrupted: no pass report."""
    from _pytest.terminal import TerminalReporter

    def broken(self: Any, excinfo: Any) -> None:
        raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")

    monkeypatch.setattr(TerminalReporter, "pytest_keyboard_interrupt", broken)
    root = failing.parent
    before = _digest(root / "reports") | _digest(root / "golden")
    _interrupting(monkeypatch, "dropout_off", _raise_keyboard_interrupt)
    code, _, err = run_here(Case("plugin", failing, "", None), capfd)
    _assert_interrupted(code, err, 130, before,
                        _digest(root / "reports") | _digest(root / "golden"))


def _full_disk(monkeypatch: pytest.MonkeyPatch, after: int) -> list[Path]:
    """Every file write after the first ``after`` fails with ENOSPC (a full disk)."""
    from paritygate import files

    stage = files._stage
    seen: list[Path] = []

    def staged(path: Path, data: bytes) -> str:
        seen.append(path)
        if len(seen) > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return stage(path, data)

    monkeypatch.setattr(files, "_stage", staged)
    return seen


@pytest.mark.parametrize("allow_skips", [False, True], ids=["plain", "allow-skips"])
@pytest.mark.parametrize("after", [0, 2], ids=["first-file", "third-file"])
def test_a_full_disk_while_blessing_is_exit_2_and_changes_no_baseline(
    failing: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str], after: int, allow_skips: bool,
) -> None:
    root = failing.parent
    golden = _digest(root / "golden")
    attempted = _full_disk(monkeypatch, after)
    args = ("--update-golden", "--report-dir", str(tmp_path / "r"))
    args += ("--allow-skips",) * allow_skips
    code, _, err = run_here(Case("enospc", root / "clean.yaml", "", None, args), capfd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "No space left on device" in lines[0], err
    assert str(root / "golden" / NAME) in lines[0] and "golden.dir" in lines[0], lines
    assert len(attempted) > after  # the fake was reached
    assert _digest(root / "golden") == golden  # no file of the baseline changed
    assert not (tmp_path / "r" / "report.json").exists()  # no verdict without its baseline


def test_a_full_disk_while_reporting_is_exit_2_and_keeps_the_old_report(
    failing: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    root = failing.parent
    before = _digest(root / "reports")
    _full_disk(monkeypatch, 1)
    code, _, err = run_here(Case("enospc-report", failing, "", None), capfd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "No space left on device" in lines[0] and "report_dir" in lines[0], lines
    report = json.loads((root / "reports" / "report.json").read_text(encoding="utf-8"))
    assert report["status"] == "fail"
    changed = {k for k, v in _digest(root / "reports").items() if before.get(k) != v}
    assert not changed & {"report.json", "report.md", "report.html", "junit.xml"}, changed


@pytest.mark.parametrize("where", ["report-dir-flag", "report_dir-absolute", "golden-dir"])
def test_a_dangling_link_to_an_unwritable_place_is_refused_before_any_check(
    failing: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], where: str,
) -> None:
    link = tmp_path / "link"
    link.symlink_to("/proc/paritygate-nowhere/reports")  # /proc takes no new files
    assert not link.exists()
    data = yaml.safe_load(failing.read_text(encoding="utf-8"))
    args: tuple[str, ...] = ()
    key = "report_dir"
    if where == "report-dir-flag":
        args = ("--report-dir", str(link))  # named by the key it overrides
    elif where == "report_dir-absolute":
        data["report_dir"] = str(link / "sub")
    else:
        data["golden"]["dir"] = str(link)
        key = "golden.dir"
    config = _config(tmp_path, data)
    start = cpu_seconds_now()
    code, out, err = run_here(Case("link", config, "", None, args), capfd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and key in lines[0], (code, err)
    assert "loading inputs" not in out and "[paritygate]" not in out  # before any check
    assert cpu_seconds_now() - start < 60


def test_concurrent_blesses_leave_one_runs_baseline(clean_demo: Path, tmp_path: Path) -> None:
    """Three blessers with different probe seeds on one shared baseline folder: the first
    holds the lock, the others are refused naming it; every baseline file is one run's."""
    configs = []
    for seed in (1, 2, 3):
        data = base_config(clean_demo)
        data["golden"] = {**data["golden"], "dir": str(tmp_path / "golden")}
        data["policy"]["probes"]["seed"] = seed
        data["report_dir"] = str(tmp_path / f"reports-{seed}")
        configs.append(_config(tmp_path, data, f"seed{seed}.yaml"))
    procs = [_popen(c, "--update-golden") for c in configs]
    streams = [p.communicate(timeout=600) for p in procs]
    outcomes = [(p.returncode, out, err) for p, (out, err) in zip(procs, streams, strict=True)]
    blessed = [c for c, (code, _, _) in zip(configs, outcomes, strict=True) if code == 0]
    assert blessed, outcomes
    for code, _, err in outcomes:
        if code != 0:
            lines = [line for line in err.splitlines() if line.strip()]
            assert code == 2 and len(lines) == 1 and "pid" in lines[0], (code, err)
    records = [json.loads(p.read_text(encoding="utf-8"))
               for p in (tmp_path / "golden" / NAME).glob("*.json")
               if not p.name.endswith(".obtained.json") and not p.name.endswith(".detail.json")]
    assert len(records) >= 7
    probe_sets = {(r.get("provenance") or {}).get("probes_sha256") for r in records}
    assert len(probe_sets) == 1, probe_sets  # one run's baseline, never a mix
    if len(blessed) == 1:
        after = subprocess.run([sys.executable, "-m", "paritygate", "run", str(blessed[0])],
                               capture_output=True, text=True, env=_env(), timeout=600)
        assert after.returncode == 0, after.stdout + after.stderr
        assert "probe set changed" not in after.stdout


def test_a_checkpoint_larger_than_memory_is_refused_at_once(
    clean_demo: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    """A sparse safetensors file whose header declares a tensor larger than memory (100 GB
    at least): refused before a byte of it is read or hashed."""
    from paritygate.checkpoints import memory_bytes

    size = max(100 * 2**30, 2 * (memory_bytes() or 0))
    header = json.dumps({"w": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})
    body = size - 8 - len(header.encode()) - 8
    header = json.dumps({"w": {"dtype": "F32", "shape": [body // 4],
                               "data_offsets": [0, body // 4 * 4]}})
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header.encode())
        fh.truncate(8 + len(header) + body // 4 * 4)  # sparse: no data blocks written
    data = base_config(clean_demo)
    data["policy"]["checkpoint"] = str(path)
    data["golden"] = {**data["golden"], "dir": str(tmp_path / "golden")}
    config = _config(tmp_path, data)
    read_before = read_bytes_now()
    code, _, err = run_here(Case("huge", config, "huge.safetensors", "policy.checkpoint"), capfd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "huge.safetensors" in lines[0] and "policy.checkpoint" in lines[0], lines
    # refused from the header: this process read megabytes (imports), never the file's GBs
    assert read_bytes_now() - read_before < 2**28
