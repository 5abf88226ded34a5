"""A TRL run, gated at every save: a real GRPOTrainer writes 8 checkpoints, its config written by
``ParityGateCallback.from_trainer`` before the first save and blessed on the first checkpoint
(``bless_first``). Every later clean checkpoint passes (no false alarm from float noise against
the step-1 baseline); a serving temperature planted in one checkpoint's generation_config.json
fails at exactly that step with its cause. The same series through ``paritygate run --all
--bless-first`` says the same per checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl")

STEPS = 8
FAULT_STEP = 5
"""The save whose serving generation_config.json samples at 0.7 (the trainer at 1.0)."""


def _planter() -> Any:
    from transformers import TrainerCallback

    class ServingTemperature(TrainerCallback):  # type: ignore[misc]
        """A deploy step that writes the served sampling settings into one checkpoint."""

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == FAULT_STEP:
                path = Path(args.output_dir) / f"checkpoint-{FAULT_STEP}" / \
                    "generation_config.json"
                data = json.loads(path.read_text(encoding="utf-8"))
                data["temperature"] = 0.7
                path.write_text(json.dumps(data), encoding="utf-8")

    return ServingTemperature()


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One GRPO run of 8 saves gated by the callback; shared with the run --all test."""
    import trl_run

    from paritygate.integrations.trl import ParityGateCallback

    out = tmp_path_factory.mktemp("series") / "grpo_out"
    trainer = trl_run.grpo_trainer(out, max_steps=STEPS, save_steps=1, callbacks=[_planter()])
    callback = ParityGateCallback.from_trainer(trainer, prompts=trl_run.PROMPTS[:4],
                                               bless_first=True)
    trainer.train()
    return {"out": out, "callback": callback, "config": out / "paritygate" / "gate.yaml"}


def test_the_callback_blesses_the_first_save_and_gates_each_later_one(
    series: dict[str, Any]
) -> None:
    outcomes = series["callback"].outcomes
    assert [o.step for o in outcomes] == list(range(1, STEPS + 1))
    first = outcomes[0]
    assert first.status == "pass" and first.blessed, first.summary()
    by_step = {o.step: o for o in outcomes}
    false_alarms = [o.summary() for o in outcomes[1:] if o.step != FAULT_STEP and o.failed]
    assert false_alarms == []
    fault = by_step[FAULT_STEP]
    assert fault.status == "fail"
    assert (fault.root_cause_check, fault.root_cause_kind) == ("sampling_config",
                                                               "sampling_protocol")
    golden = series["out"] / "paritygate" / "golden" / "grpo_out"
    provenance = json.loads((golden / "logprob_delta.json").read_text(encoding="utf-8"))
    assert provenance["provenance"]["blessed_first"] == {"step": 1, "checkpoint": "checkpoint-1"}
    assert "noise" in provenance


def test_run_all_bless_first_says_the_same_per_checkpoint(
    series: dict[str, Any], tmp_path: Path
) -> None:
    data = yaml.safe_load(series["config"].read_text(encoding="utf-8"))
    data["golden"]["dir"] = str(tmp_path / "golden")  # a fresh baseline for this series
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), "--all",
                           "--bless-first", "--report-dir", str(tmp_path / "rep")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = {}
    for step in range(1, STEPS + 1):
        report = json.loads((tmp_path / "rep" / f"checkpoint-{step}" / "report.json")
                            .read_text(encoding="utf-8"))
        root = report["root_cause"] or {}
        verdicts[step] = (report["status"], root.get("kind"))
    expected = {step: ("pass", None) for step in range(1, STEPS + 1)}
    expected[FAULT_STEP] = ("fail", "sampling_protocol")
    assert verdicts == expected
    # blessing again over the baseline that now exists is refused, naming the file
    again = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), "--all",
                            "--bless-first"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert again.returncode == 2
    line = again.stderr.strip().splitlines()
    assert len(line) == 1 and ".json" in line[0] and "--bless-first" in line[0], again.stderr
