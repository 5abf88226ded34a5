"""Trainer output folders: a real TRL GRPO run's ``output_dir`` is gated at its latest
``checkpoint-N`` (or another, or each), the step is recorded, the trainer's pickles are never
opened, and a folder without checkpoints or a step that does not exist is exit 2."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl")

TRAINER_PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


@pytest.fixture(scope="session")
def grpo_run(build_once: Any) -> Path:
    """``grpo_out/checkpoint-2`` and ``checkpoint-4`` of a seeded 4-step GRPOTrainer run."""
    import trl_run

    return build_once("grpo-run", trl_run.build, seed=0)


class _Trap:
    """Unpickling this runs a command that creates the marker file (a hostile pickle)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _copy_with_traps(run: Path, dest: Path) -> Path:
    """A copy of the run whose trainer pickles touch ``dest/unpickled`` when loaded."""
    shutil.copytree(run, dest)
    marker = dest / "unpickled"
    for checkpoint in (dest / "grpo_out").glob("checkpoint-*"):
        for name in TRAINER_PICKLES:
            with open(checkpoint / name, "wb") as handle:
                pickle.dump(_Trap(marker), handle)
    return marker


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    return subprocess.run([sys.executable, "-m", "paritygate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _write(data: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_output_dir_resolves_to_latest_and_records_the_step(grpo_run: Path, tmp_path: Path) -> None:
    import trl_run

    from paritygate.config import apply_checkpoint
    from paritygate.load import config_from_dict

    config = config_from_dict(trl_run.gate_config(grpo_run), tmp_path / "gate.yaml")
    record = config.trainer_checkpoint
    assert record.path == grpo_run / "grpo_out" / "checkpoint-4"
    assert config.causal_lm.model_dir == record.path
    assert (record.step, record.step_source) == (4, "trainer_state.json global_step")
    assert record.steps == (2, 4) and record.chosen_by == "the latest"
    assert set(TRAINER_PICKLES) | {"trainer_state.json"} == set(record.trainer_files)
    pinned = config_from_dict(trl_run.gate_config(grpo_run, checkpoint=2), tmp_path / "g.yaml")
    assert pinned.trainer_checkpoint.step == 2
    assert pinned.causal_lm.model_dir.name == "checkpoint-2"
    overridden = apply_checkpoint(config_from_dict(trl_run.gate_config(grpo_run),
                                                   tmp_path / "gate.yaml"), "2")
    assert overridden.trainer_checkpoint.step == 2
    assert overridden.trainer_checkpoint.chosen_by == "--checkpoint 2"
    from paritygate.gate import Gate

    path = _write(trl_run.gate_config(grpo_run), tmp_path / "api.yaml")
    assert Gate.from_path(path, checkpoint=2).config.trainer_checkpoint.step == 2
    assert Gate.from_path(path).config.trainer_checkpoint.step == 4


def test_bad_output_dirs_and_steps_are_input_errors(grpo_run: Path, tmp_path: Path) -> None:
    import trl_run

    from paritygate.errors import InputError
    from paritygate.load import config_from_dict

    empty = tmp_path / "empty_out"
    empty.mkdir()
    (empty / "training_args.bin").write_bytes(b"")
    data = trl_run.gate_config(grpo_run)
    data["causal_lm"]["model_dir"] = str(empty)
    with pytest.raises(InputError, match="without checkpoint-N folders") as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert err.value.key == "causal_lm.model_dir"
    with pytest.raises(InputError, match="no checkpoint-3; its checkpoints: checkpoint-2, "
                                         "checkpoint-4") as err:
        config_from_dict(trl_run.gate_config(grpo_run, checkpoint=3), tmp_path / "gate.yaml")
    assert err.value.key == "causal_lm.checkpoint"
    with pytest.raises(InputError, match="no final model"):
        config_from_dict(trl_run.gate_config(grpo_run, checkpoint="final"), tmp_path / "g.yaml")


def test_cli_gates_latest_then_each_checkpoint_without_unpickling(
    grpo_run: Path, tmp_path: Path
) -> None:
    import trl_run

    marker = _copy_with_traps(grpo_run, tmp_path / "run")
    root = tmp_path / "run"
    config = _write(trl_run.gate_config(root), root / "gate" / "gate.yaml")
    bless = _cli("run", str(config), "--update-golden", "--report-dir", "rep", cwd=root)
    assert bless.returncode == 0, bless.stdout + bless.stderr
    assert "trainer checkpoint checkpoint-4 (step 4, the latest of 2 in grpo_out)" in bless.stdout
    report = json.loads((root / "rep" / "report.json").read_text(encoding="utf-8"))
    assert report["checkpoint"]["trainer"]["step"] == 4
    assert report["checkpoint"]["path_abs"].startswith(str(root / "grpo_out" / "checkpoint-4"))
    assert "trainer step 4" in (root / "rep" / "report.md").read_text(encoding="utf-8")
    provenance = json.loads((root / "golden" / "grpo-policy" / "logprob_delta.json")
                            .read_text(encoding="utf-8"))["provenance"]
    assert provenance["trainer"]["step"] == 4

    every = _cli("run", str(config), "--all", "--report-dir", "all", cwd=root)
    assert every.returncode == 0, every.stdout + every.stderr
    for step in (2, 4):
        assert f"checkpoint-{step} (step {step}): pass" in every.stdout
        each = json.loads((root / "all" / f"checkpoint-{step}" / "report.json")
                          .read_text(encoding="utf-8"))
        assert each["name"] == "grpo-policy" and each["status"] == "pass"
        assert each["checkpoint"]["trainer"]["step"] == step
    assert not marker.exists(), "a trainer pickle was unpickled"
    history = _cli("history", "all", cwd=root)
    assert history.returncode == 0, history.stderr
    page = (root / "all" / "history.html").read_text(encoding="utf-8")
    assert "Every gated step passed (2)" in page
    assert 'href="checkpoint-2/report.md"' in page and 'href="checkpoint-4/report.md"' in page
    assert (root / "all" / "history" / "logprob_delta.png").is_file()

    missing = _cli("run", str(config), "--checkpoint", "3", cwd=root)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"paritygate: error: {config}: --checkpoint: {root / 'grpo_out'}: no checkpoint-3; "
        "its checkpoints: checkpoint-2, checkpoint-4"]


def test_init_on_output_dir_picks_the_latest_and_says_so(grpo_run: Path, tmp_path: Path) -> None:
    shutil.copytree(grpo_run / "grpo_out", tmp_path / "grpo_out")
    done = _cli("init", "grpo_out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "inspected checkpoint-4 (step 4, the latest of 2 in grpo_out)" in done.stdout
    data = yaml.safe_load((tmp_path / "configs" / "grpo_out.yaml").read_text(encoding="utf-8"))
    assert data["causal_lm"]["model_dir"] == "../grpo_out"
    assert data["causal_lm"]["checkpoint"] == "latest"
    assert data["causal_lm"]["tokenizer"]["training"] is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "trainer_state.json").write_text("{}", encoding="utf-8")
    empty = _cli("init", "empty", cwd=tmp_path)
    assert empty.returncode == 2
    assert empty.stderr.strip() == ("paritygate: error: empty: trainer output_dir without "
                                    "checkpoint-N folders (nothing saved yet, or "
                                    "save_strategy: 'no')")
