"""``paritygate.integrations.trl.ParityGateCallback`` on a real GRPOTrainer run: each saved
checkpoint is gated in a subprocess, its numbers reach the trainer's own log, a TensorBoard
event file and JSON lines; bad input never crashes training, ``stop_on_fail`` stops it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def blessed(build_once: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gate config over the seeded GRPO run, blessed on its latest checkpoint."""
    import trl_run

    run = build_once("grpo-run", trl_run.build, seed=0)
    root = tmp_path_factory.mktemp("blessed")
    shutil.copytree(run / "gate", root / "gate")
    data = trl_run.gate_config(root)
    data["causal_lm"]["model_dir"] = str(run / "grpo_out")
    config = root / "gate" / "gate.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    done = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config),
                           "--update-golden", "--report-dir", str(root / "rep")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return config


class _Recorder:
    """The trainer's loggers' view: every ``on_log`` call, as report_to integrations get it."""

    def __new__(cls) -> Any:
        from transformers import TrainerCallback

        class Recorder(TrainerCallback):  # type: ignore[misc]
            def __init__(self) -> None:
                self.logs: list[tuple[int, dict[str, Any]]] = []

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                       **kw: Any) -> None:
                self.logs.append((state.global_step, dict(logs or {})))

        return Recorder()


@pytest.fixture(scope="module")
def gated_run(blessed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import time

    import trl_run

    from paritygate.integrations.trl import ParityGateCallback

    out = tmp_path_factory.mktemp("with-callback") / "grpo_out"
    recorder = _Recorder()
    trainer = trl_run.grpo_trainer(out, callbacks=[recorder])
    callback = ParityGateCallback.attach(trainer, blessed)
    start = time.perf_counter()
    trainer.train()
    return {"out": out, "trainer": trainer, "callback": callback, "recorder": recorder,
            "seconds": time.perf_counter() - start}


def test_each_saved_checkpoint_is_gated_and_logged(gated_run: dict[str, Any]) -> None:
    out, callback = gated_run["out"], gated_run["callback"]
    assert [(o.step, o.status) for o in callback.outcomes] == [(2, "pass"), (4, "pass")]
    for step in (2, 4):
        report = json.loads((out / "paritygate" / f"checkpoint-{step}" / "report.json")
                            .read_text(encoding="utf-8"))
        assert report["status"] == "pass" and report["checkpoint"]["trainer"]["step"] == step
        assert report["name"] == "grpo-policy"
    logged = {step: logs for step, logs in gated_run["recorder"].logs
              if "paritygate/passed" in logs}
    assert sorted(logged) == [2, 4]
    assert logged[4]["paritygate/passed"] == 1.0
    assert logged[4]["paritygate/logprob_delta/delta_max_abs"] < 1e-4
    history = [h for h in gated_run["trainer"].state.log_history if "paritygate/passed" in h]
    assert [h["step"] for h in history] == [2, 4]
    lines = (out / "paritygate" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [2, 4]
    assert json.loads(lines[0])["status"] == "pass"
    per_gate = [o.seconds for o in callback.outcomes]
    print(f"callback overhead per checkpoint: {per_gate} s; run {gated_run['seconds']:.1f} s")


def test_the_event_file_holds_the_metrics_for_tensorboard(gated_run: dict[str, Any]) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(gated_run["out"] / "paritygate"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "paritygate/passed" in tags and "paritygate/logprob_delta/delta_max_abs" in tags
    passed = events.Scalars("paritygate/passed")
    assert [(e.step, e.value) for e in passed] == [(2, 1.0), (4, 1.0)]
    delta = events.Scalars("paritygate/logprob_delta/delta_max_abs")
    expected = [o.scalars["paritygate/logprob_delta/delta_max_abs"]
                for o in gated_run["callback"].outcomes]
    assert [e.value for e in delta] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("stop_on_fail", [False, True])
def test_bad_input_is_logged_and_training_goes_on_unless_stop_on_fail(
    blessed: Path, tmp_path: Path, stop_on_fail: bool
) -> None:
    import trl_run

    from paritygate.integrations.trl import ParityGateCallback

    data = yaml.safe_load(blessed.read_text(encoding="utf-8"))
    data["causal_lm"]["probes"] = str(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    trainer = trl_run.grpo_trainer(tmp_path / "grpo_out")
    callback = ParityGateCallback.attach(trainer, bad, stop_on_fail=stop_on_fail)
    trainer.train()
    first = callback.outcomes[0]
    assert first.status == "input_error" and first.exit_code == 2
    assert first.line is not None and "missing.jsonl" in first.line
    assert "\n" not in first.line
    assert trainer.state.global_step == (2 if stop_on_fail else 4)
    assert len(callback.outcomes) == (1 if stop_on_fail else 2)
