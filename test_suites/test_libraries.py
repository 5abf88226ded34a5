"""The libraries the ground floor leans on: filelock for the bless lock, pkgutil for
``module:callable``, and the text table of ``paritygate checks``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paritygate.errors import InputError
from paritygate.files import FileLock, LockHeld
from paritygate.golden import BlessInProgress, GoldenStore
from paritygate.imports import import_callable

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_second_blesser_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from paritygate.golden import GoldenStore
            store = GoldenStore(Path({str(tmp_path / "demo")!r}))
            store.begin()
            print("locked", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(SRC)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        store = GoldenStore(tmp_path / "demo")
        with pytest.raises(BlessInProgress) as info:
            store.begin()
        assert info.value.pid == holder.pid and f"pid {holder.pid}" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    store.begin()  # the kernel dropped the killed holder's lock: taken over
    store.discard()


def test_the_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    first = FileLock(tmp_path / "x.lock").acquire()
    with pytest.raises(LockHeld):
        FileLock(tmp_path / "x.lock").acquire()
    first.release()
    assert not first.held
    FileLock(tmp_path / "x.lock").acquire().release()


def test_module_callable_resolves_dotted_attributes(tmp_path: Path) -> None:
    assert import_callable("os.path:join", tmp_path / "g.yaml", "k") is __import__("os").path.join
    assert import_callable("pathlib:Path.cwd", tmp_path / "g.yaml", "k")() == Path.cwd()


@pytest.mark.parametrize(("spec", "says"), [
    ("os.path", "expected 'module:callable'"),
    ("os path:join", "expected 'module:callable'"),
    ("os.path:nothing_here", "has no attribute 'nothing_here'"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("os:sep", "is not callable"),
])
def test_module_callable_errors_name_the_key(tmp_path: Path, spec: str, says: str) -> None:
    with pytest.raises(InputError) as info:
        import_callable(spec, tmp_path / "g.yaml", "policy.fn")
    line = info.value.line()
    assert "policy.fn" in line and says in line


def test_checks_listing_keeps_its_columns_apart() -> None:
    from paritygate.checks import CHECK_IDS

    out = subprocess.run([sys.executable, "-m", "paritygate", "checks"], capture_output=True,
                         text=True, env={"PYTHONPATH": str(SRC)}, check=True).stdout
    rows = [ln.split(maxsplit=3) for ln in out.splitlines()]
    assert [row[0] for row in rows] == list(CHECK_IDS)
    # every column starts at one offset, past the widest cell before it (hf_model included)
    ids, families = (max(len(row[i]) for row in rows) for i in (0, 1))
    for line, row in zip(out.splitlines(), rows, strict=True):
        assert line[ids + 1:].startswith(row[1]) and line[ids + families + 2:].startswith(row[2])
