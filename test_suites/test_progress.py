"""Progress: plain lines without escape codes off a terminal or in CI; a bar on a terminal."""

from __future__ import annotations

import io

import pytest

from paritygate.progress import Progress, stage, use_bar


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PARITYGATE_PROGRESS", raising=False)
    out = io.StringIO()
    with Progress("train", 20, stream=out) as bar:
        for _ in range(20):
            bar.advance()
    with stage("export", stream=out):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "train: 0/20"
    assert lines[1:10] == [f"train: {2 * k}/20 ({10 * k}%)" for k in range(1, 10)]
    assert lines[10].startswith("train: 20/20 done in ")
    assert lines[11:13] == ["export ...", lines[12]] and lines[12].startswith("export: done in ")
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_ci_gets_plain_lines_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARITYGATE_PROGRESS", raising=False)
    monkeypatch.setenv("CI", "true")
    assert not use_bar(FakeTTY())
    monkeypatch.delenv("CI")
    monkeypatch.setenv("TERM", "xterm")
    pytest.importorskip("tqdm")
    assert use_bar(FakeTTY())
    monkeypatch.setenv("PARITYGATE_PROGRESS", "plain")
    assert not use_bar(FakeTTY())


def test_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    for var in ("CI", "PARITYGATE_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = FakeTTY()
    with Progress("train", 5, stream=out) as bar:
        for _ in range(5):
            bar.advance()
    assert "\r" in out.getvalue() and "5/5" in out.getvalue()
    assert "train: 0/5" not in out.getvalue()


def test_off_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITYGATE_PROGRESS", "off")
    out = io.StringIO()
    with Progress("train", 5, stream=out) as bar, stage("export", stream=out):
        bar.advance(5)
    assert out.getvalue() == ""
