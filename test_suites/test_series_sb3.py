"""An SB3 run, gated at every save: a real PPO on CartPole saves 8 zips through a
``CheckpointCallback``; ``ParityGateCallback.for_model`` writes the config from the model before
the first save and blesses the first zip (``bless_first``). The run's own export step writes the
served ONNX at each save. Every clean save passes; an export that was not refreshed at one save
(a stale artifact) and a checkpoint saved with a NaN weight each fail at exactly their step with
their cause. The saved zips through ``paritygate run --all --bless-first`` (the gate exporting
each zip itself) say the same per zip."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

SAVE_FREQ = 64
SAVES = 8
STALE_STEP = 3 * SAVE_FREQ
"""The save whose export step did not run: the served ONNX is still the previous save's."""
NAN_STEP = 6 * SAVE_FREQ
"""The save written with a NaN in one actor weight."""
CHECKS = ["weights_load", "logits_agreement", "export_integrity"]


def _export(policy: Any, path: Path) -> None:
    """The run's export step: the actor path to ``action_net`` logits, dynamic batch."""
    import torch

    class Actor(torch.nn.Module):
        def __init__(self, policy: Any) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            features = self.policy.extract_features(obs, self.policy.pi_features_extractor)
            return self.policy.action_net(self.policy.mlp_extractor.forward_actor(features))

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Actor(policy).eval(), (torch.zeros(1, 4),), str(path), dynamo=False,
                      input_names=["obs"], output_names=["logits"],
                      dynamic_axes={"obs": {0: "batch"}, "logits": {0: "batch"}})


def _nan_weight(zip_path: Path) -> None:
    """Rewrite a saved zip with one NaN in the actor's weights (a diverged update)."""
    import torch

    with zipfile.ZipFile(zip_path) as src:
        members = {info.filename: src.read(info) for info in src.infolist()}
    state = torch.load(io.BytesIO(members["policy.pth"]), weights_only=True)
    state["action_net.weight"][0, 0] = float("nan")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    members["policy.pth"] = buffer.getvalue()
    with zipfile.ZipFile(zip_path, "w") as out:
        for name, data in members.items():
            out.writestr(name, data)


def _planter(saves: Path, artifact: Path) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class ExportStep(BaseCallback):  # type: ignore[misc]
        """Placed between the saver and the gate: exports each save (but one), and plants a
        NaN in one saved zip."""

        def _on_step(self) -> bool:
            if self.num_timesteps % SAVE_FREQ:
                return True
            if self.num_timesteps != STALE_STEP:
                _export(self.model.policy, artifact)
            if self.num_timesteps == NAN_STEP:
                _nan_weight(saves / f"ppo_{NAN_STEP}_steps.zip")
            return True

    return ExportStep()


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One PPO run of 8 saves gated by the callback; shared with the run --all test."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback

    from paritygate.integrations.sb3 import ParityGateCallback

    root = tmp_path_factory.mktemp("sb3-series")
    saves, artifact = root / "ckpts", root / "export" / "policy.onnx"
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=SAVE_FREQ, batch_size=SAVE_FREQ, n_epochs=1,
                seed=0, device="cpu")
    gate = ParityGateCallback.for_model(model, saves, artifact=artifact, checks=CHECKS,
                                        bless_first=True, verbose=0)
    model.learn(SAVES * SAVE_FREQ, callback=CallbackList([
        CheckpointCallback(save_freq=SAVE_FREQ, save_path=str(saves), name_prefix="ppo"),
        _planter(saves, artifact), gate]))
    return {"root": root, "saves": saves, "gate": gate,
            "config": saves / "paritygate" / "gate.yaml"}


def test_the_callback_blesses_the_first_save_and_catches_each_fault_at_its_step(
    series: dict[str, Any]
) -> None:
    outcomes = series["gate"].outcomes
    assert [o.step for o in outcomes] == [SAVE_FREQ * (i + 1) for i in range(SAVES)]
    assert outcomes[0].status == "pass" and outcomes[0].blessed, outcomes[0].summary()
    verdicts = {o.step: (o.status, o.root_cause_kind) for o in outcomes}
    expected = {o.step: ("pass", None) for o in outcomes}
    expected[STALE_STEP] = ("fail", "stale_artifact")
    expected[NAN_STEP] = ("fail", "nonfinite_checkpoint")
    assert verdicts == expected, [o.summary() for o in outcomes]
    golden = json.loads((series["saves"] / "paritygate" / "golden" / "ppo-ckpts" /
                         "logits_agreement.json").read_text(encoding="utf-8"))
    assert golden["provenance"]["blessed_first"] == {"step": SAVE_FREQ,
                                                     "checkpoint": f"ppo_{SAVE_FREQ}_steps.zip"}


def test_run_all_bless_first_over_the_saved_zips(series: dict[str, Any], tmp_path: Path) -> None:
    data = yaml.safe_load(series["config"].read_text(encoding="utf-8"))
    del data["policy"]["artifact"]  # the gate exports each zip itself
    data["golden"]["dir"] = str(tmp_path / "golden")
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), "--all",
                           "--bless-first", "--report-dir", str(tmp_path / "rep")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = {}
    for i in range(SAVES):
        step = SAVE_FREQ * (i + 1)
        report = json.loads((tmp_path / "rep" / f"ppo_{step}_steps" / "report.json")
                            .read_text(encoding="utf-8"))
        verdicts[step] = (report["status"], (report["root_cause"] or {}).get("kind"))
    expected = {SAVE_FREQ * (i + 1): ("pass", None) for i in range(SAVES)}
    expected[NAN_STEP] = ("fail", "nonfinite_checkpoint")
    assert verdicts == expected
