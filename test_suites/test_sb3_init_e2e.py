"""DQN, TD3 and a ``CnnPolicy`` gated as a new user would: ``paritygate init`` on the zip, the
config's TODO lines filled in the file and nothing else, ``paritygate run`` (skipped without
stable-baselines3).

The three policies are the ones the other SB3 suites train inside the test run (seeded,
seconds, ``build_once``). The clean run blesses its baselines and exits 0; then the config gets
a ``policy.artifact`` line pointing at a faulty export and the run exits 1 with the fault
named in ``report.json``: DQN served from its target network, TD3's actor target exported in
place of its actor, the CNN policy exported whole (its value head left in).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

HERE = Path(__file__).resolve().parent
CHECKS = ("weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity")


def fill_todos(config: Path, probes: Path) -> None:
    """Fill every TODO of an init-written config the way its comments say, editing the text
    (comments kept): the probes generator becomes ``file: probes.npy``. Any other TODO fails:
    these zips must need no other answer."""
    import yaml

    from paritygate.init_infer import find_todos

    todos = find_todos(yaml.safe_load(config.read_text(encoding="utf-8")))
    assert todos == ["policy.probes.generator"], todos
    text = re.sub(r'(?m)^(\s+)generator: "TODO[^\n]*$', rf"\1file: {probes.as_posix()}",
                  config.read_text(encoding="utf-8"))
    config.write_text(text, encoding="utf-8")
    assert find_todos(yaml.safe_load(text)) == []


def point_artifact(config: Path, artifact: Path) -> None:
    """Add ``policy.artifact: <artifact>`` below the config's checkpoint line."""
    text, n = re.subn(r"(?m)^(  checkpoint: [^\n]*)$", rf"\1\n  artifact: {artifact.as_posix()}",
                      config.read_text(encoding="utf-8"))
    assert n == 1, text
    config.write_text(text, encoding="utf-8")


def paritygate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    src = Path(__file__).resolve().parents[1] / "src"
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "paritygate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=env)


def _export(module: Any, example: Any, out: Path, outputs: list[str]) -> Path:
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(out), dynamo=False, input_names=["obs"],
                          output_names=outputs,
                          dynamic_axes={"obs": {0: "batch"}, **{o: {0: "batch"} for o in outputs}})
    return out


def _dqn_target(run: Path, out: Path) -> Path:
    import torch

    from paritygate.adapters.sb3 import dqn_training_policy
    from paritygate.checkpoints import load_state_dict

    policy = dqn_training_policy(4, 2, [32, 32])
    policy.load_state_dict(load_state_dict(run / "dqn_cartpole.zip"))
    return _export(policy.q_net_target, torch.zeros(1, 4), out, ["q_values"])


def _td3_actor_target(run: Path, out: Path) -> Path:
    import torch

    from paritygate.adapters.sb3 import td3_training_policy
    from paritygate.checkpoints import load_state_dict

    policy = td3_training_policy(3, [-2.0], [2.0], [32, 32])
    policy.load_state_dict(load_state_dict(run / "td3_pendulum.zip"))

    class ActorTarget(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.actor = policy.actor_target

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.actor.mu[:-1](obs)  # type: ignore[no-any-return]

    return _export(ActorTarget(), torch.zeros(1, 3), out, ["pre_tanh"])


def _cnn_whole(run: Path, out: Path) -> Path:
    import torch

    from paritygate.adapters.sb3 import cnn_training_policy
    from paritygate.checkpoints import load_state_dict

    policy = cnn_training_policy([1, 36, 36], 3, features_dim=32, net_arch=[32])
    policy.load_state_dict(load_state_dict(run / "ppo_bar.zip"))

    class Whole(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.policy(obs)
            return out["logits"], out["value"]

    return _export(Whole(), torch.zeros(1, 1, 36, 36, dtype=torch.uint8), out,
                   ["logits", "value"])


def _train(name: str, build_once: Any) -> Path:
    if name == "dqn":
        from test_sb3_offpolicy import _train_dqn
        return build_once("sb3-dqn-cartpole", _train_dqn)  # type: ignore[no-any-return]
    if name == "td3":
        from test_sb3_offpolicy import _train_td3
        return build_once("sb3-td3-pendulum", _train_td3)  # type: ignore[no-any-return]
    from test_sb3_cnn_pixels import _train as train_bar
    return build_once("sb3-ppo-cnn-bar", train_bar)  # type: ignore[no-any-return]


CASES = {
    "dqn": ("dqn_cartpole.zip", _dqn_target, "export_integrity", "target_network_served"),
    "td3": ("td3_pendulum.zip", _td3_actor_target, "export_integrity", "target_network_served"),
    "cnn": ("ppo_bar.zip", _cnn_whole, "head_removal", "undeclared_outputs"),
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_init_fill_todos_run_clean_then_fault(algo: str, build_once: Any,
                                              tmp_path: Path) -> None:
    sys.path.insert(0, str(HERE))
    run = _train(algo, build_once)
    zip_name, fault, check, kind = CASES[algo]
    init = paritygate("init", str(run / zip_name), "--out", "configs/gate.yaml", cwd=tmp_path)
    assert init.returncode == 0, init.stdout + init.stderr
    config = tmp_path / "configs" / "gate.yaml"
    refused = paritygate("run", str(config), cwd=tmp_path)
    assert refused.returncode == 2 and "policy.probes.generator" in refused.stderr, (
        refused.stderr)
    fill_todos(config, run / "probes.npy")
    text = config.read_text(encoding="utf-8")
    text = text.replace("family: policy\n", f"family: policy\nchecks: {json.dumps(CHECKS)}\n")
    config.write_text(text, encoding="utf-8")
    clean = paritygate("run", str(config), "--update-golden", "--report-dir", "clean",
                       cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    report = json.loads((tmp_path / "clean" / "report.json").read_text(encoding="utf-8"))
    assert {c["id"]: c["status"] for c in report["checks"]} == dict.fromkeys(CHECKS, "pass")
    point_artifact(config, fault(run, tmp_path / "faulty" / "policy.onnx"))
    faulty = paritygate("run", str(config), "--report-dir", "faulty-report", cwd=tmp_path)
    assert faulty.returncode == 1, faulty.stdout[-3000:] + faulty.stderr[-3000:]
    report = json.loads((tmp_path / "faulty-report" / "report.json").read_text(encoding="utf-8"))
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id[check]["status"] == "fail", by_id[check]
    found = [r.get("finding") for r in by_id[check]["reasons"]]
    assert kind in found, (found, by_id[check])
