"""Bad input of a run's series, said before any gate runs: a gap in the saves, an unreadable or
mismatched trainer_state.json, a folder without saves, ``--bless-first`` over a baseline that
exists. Each is exit 2 with one line naming the file (or the missing checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paritygate.errors import InputError
from paritygate.trainer_output import checkpoint_series, saved_zips


def _series(root: Path, steps: list[int], save_steps: int | None = 2) -> Path:
    out = root / "grpo_out"
    for step in steps:
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        state = {"global_step": step, **({"save_steps": save_steps} if save_steps else {})}
        (folder / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    return out


def test_a_complete_series_is_listed_by_step(tmp_path: Path) -> None:
    out = _series(tmp_path, [2, 4, 6, 7])  # the last save may be the end of training, off-grid
    assert [n for n, _ in checkpoint_series(out)] == [2, 4, 6, 7]
    # older saves removed by save_total_limit leave no gap inside the series
    assert [n for n, _ in checkpoint_series(_series(tmp_path / "b", [6, 8]))] == [6, 8]


def test_a_gap_names_the_missing_checkpoint(tmp_path: Path) -> None:
    out = _series(tmp_path, [2, 4, 8])
    with pytest.raises(InputError) as err:
        checkpoint_series(out)
    assert err.value.file == str(out) and err.value.key == "checkpoint-6"
    assert "save_steps 2" in err.value.cause and "checkpoint-8" in err.value.cause


def test_an_unreadable_or_foreign_trainer_state_names_the_file(tmp_path: Path) -> None:
    out = _series(tmp_path, [2, 4])
    state = out / "checkpoint-4" / "trainer_state.json"
    state.write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError) as err:
        checkpoint_series(out)
    assert err.value.file == str(state)
    state.write_text(json.dumps({"global_step": 40}), encoding="utf-8")
    with pytest.raises(InputError) as err:
        checkpoint_series(out)
    assert err.value.file == str(state) and err.value.key == "global_step"


def test_sb3_saves_are_listed_by_step_and_their_absence_is_bad_input(tmp_path: Path) -> None:
    for step in (128, 256, 1024):
        (tmp_path / f"ppo_{step}_steps.zip").write_bytes(b"")
    (tmp_path / f"other_{64}_steps.zip").write_bytes(b"")
    listed = saved_zips(tmp_path / "ppo_128_steps.zip", tmp_path / "gate.yaml")
    assert [n for n, _ in listed] == [128, 256, 1024]  # one prefix: this run's saves
    assert len(saved_zips(tmp_path, tmp_path / "gate.yaml")) == 4
    with pytest.raises(InputError) as err:
        saved_zips(tmp_path / "empty", tmp_path / "gate.yaml")
    assert err.value.file == str(tmp_path / "gate.yaml") and err.value.key == "--all"


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    return subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), *args],
                          capture_output=True, text=True, env=env, timeout=300,
                          cwd=config.parent)


def test_the_cli_says_a_gap_or_an_existing_baseline_in_one_line(tmp_path: Path) -> None:
    out = _series(tmp_path, [2, 4, 8])
    (out / "checkpoint-2" / "config.json").write_text("{}", encoding="utf-8")
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump({
        "name": "series", "family": "causal_lm", "checks": ["weights_load"],
        "causal_lm": {"model_dir": str(out), "probes": str(tmp_path / "p.jsonl"),
                      "sampling": {"training": str(tmp_path / "t.yaml")}},
        "golden": {"dir": str(tmp_path / "golden")}}), encoding="utf-8")
    (tmp_path / "p.jsonl").write_text('{"id": "a", "text": "hi"}\n', encoding="utf-8")
    (tmp_path / "t.yaml").write_text("temperature: 1.0\n", encoding="utf-8")
    gap = _cli(config, "--all")
    assert gap.returncode == 2 and gap.stderr.count("\n") == 1, gap.stderr
    assert "checkpoint-6" in gap.stderr and "Traceback" not in gap.stderr
    (out / "checkpoint-8").rename(out / "checkpoint-6")
    state = out / "checkpoint-6" / "trainer_state.json"
    state.write_text(json.dumps({"global_step": 6, "save_steps": 2}), encoding="utf-8")
    baseline = tmp_path / "golden" / "series" / "weights_load.json"
    baseline.parent.mkdir(parents=True)
    baseline.write_text(json.dumps({"metrics": {}}), encoding="utf-8")
    for args in (["--all", "--bless-first"], ["--checkpoint", "2", "--bless-first"]):
        again = _cli(config, *args)
        assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
        assert str(baseline) in again.stderr and "never re-blesses" in again.stderr
    assert json.loads(baseline.read_text(encoding="utf-8")) == {"metrics": {}}  # untouched
