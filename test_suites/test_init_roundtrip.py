"""Every policy layout ``paritygate init`` accepts, round-tripped as docs/init.md tells a user:
``init`` on the checkpoint (with and without ``--artifact``), every TODO answered and nothing
else (:func:`init_fill.fill`), then ``paritygate run`` on the written config blesses a clean
subject with exit 0.

Subjects are the SB3 policies the other suites train (``build_once``: built once per test run)
plus a tiny PPO and a CleanRL training checkpoint made here; the artifact given to
``--artifact`` is what the user ships: ``paritygate export`` of the filled config (ONNX, with
its manifest), or the actor traced to TorchScript / exported to ``.pt2``. The config names it
(never dropped for an export of its own), so an export built from DQN's target network fails
by name. Each run gates the checks init's answers decide (weights, heads, outputs, artifact).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from init_fill import Replace, fill, run_cli

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

HERE = Path(__file__).resolve().parent
CHECKS = ("weights_load", "head_removal", "logits_agreement", "export_integrity")


def _train_ppo(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import PPO

    out.mkdir(parents=True, exist_ok=True)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=seed,
                device="cpu", policy_kwargs={"net_arch": [16]})
    model.learn(128)
    model.save(out / "ppo_cartpole.zip")
    rng = np.random.default_rng(seed)
    np.save(out / "probes.npy", rng.normal(0, [1.0, 0.5, 0.1, 0.5], (32, 4)).astype(np.float32))


def _subject(layout: str, build_once: Any) -> tuple[Path, str]:
    """(folder, zip name) of the SB3 subject of ``layout``."""
    sys.path.insert(0, str(HERE))
    if layout == "ppo":
        return build_once("sb3-ppo-cartpole-tiny", _train_ppo), "ppo_cartpole.zip"
    if layout in ("a2c", "torchscript", "pt2"):
        from test_sb3_a2c import _train as a2c
        return build_once("sb3-a2c-cartpole", a2c), "a2c_cartpole.zip"
    if layout == "sac":
        from test_sb3_sac import _train as sac
        return build_once("sb3-sac-pendulum", sac), "sac_pendulum.zip"
    if layout == "td3":
        from test_sb3_offpolicy import _train_td3
        return build_once("sb3-td3-pendulum", _train_td3), "td3_pendulum.zip"
    if layout == "dqn":
        from test_sb3_offpolicy import _train_dqn
        return build_once("sb3-dqn-cartpole", _train_dqn), "dqn_cartpole.zip"
    from test_sb3_cnn_pixels import _train as cnn
    return build_once("sb3-ppo-cnn-bar", cnn), "ppo_bar.zip"


def _cleanrl(root: Path) -> Path:
    """A CleanRL continuous PPO agent saved as a training checkpoint (model, optimizer, step)."""
    import torch

    from paritygate.demo.continuous import CleanRLAgent

    torch.manual_seed(0)
    agent = CleanRLAgent()
    ckpt = root / "runs" / "agent.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"model": agent.state_dict(),
                "optimizer": torch.optim.Adam(agent.parameters()).state_dict(),
                "global_step": 4096}, ckpt)
    return ckpt


CLEANRL_ANSWERS: dict[str, object] = {
    "policy.training_factory": "paritygate.demo.continuous:build_cleanrl_agent",
    "policy.inference_factory": "paritygate.demo.continuous:build_cleanrl_actor",
    "policy.policy_output": "mean",
    "policy.probes.generator": "paritygate.demo.continuous:probe_observations",
    "policy.distribution.squash": "clip",
    "policy.distribution.action_scale": 1.0,
    "policy.distribution.action_bias": 0.0,
}


def _init(root: Path, capfd: Any, checkpoint: Path, config: str, *extra: str) -> Path:
    code, out, err = run_cli(["init", str(checkpoint), "--out", f"configs/{config}.yaml",
                              *extra], root, capfd)
    assert code == 0, out + err
    return root / "configs" / f"{config}.yaml"


def _bless(root: Path, capfd: Any, config: Path) -> tuple[int, str]:
    args = ["run", str(config), "--update-golden", "--report-dir", f"reports/{config.stem}"]
    for cid in CHECKS:
        args += ["--check", cid]
    code, out, err = run_cli(args, root, capfd)
    return code, out[-3000:] + err[-3000:]


def _ship(layout: str, root: Path, capfd: Any, config: Path, run: Path, zip_name: str) -> Path:
    """The artifact the user ships for ``layout``: ``paritygate export`` of the filled config
    (ONNX and its manifest), or the A2C actor as TorchScript / ``.pt2``."""
    if layout in ("torchscript", "pt2"):
        from test_sb3_a2c import _torch_artifact

        fmt, suffix = ("torchscript", ".pt") if layout == "torchscript" else ("torch_export",
                                                                              ".pt2")
        return _torch_artifact(run / zip_name, root / "ship" / f"policy{suffix}", fmt)
    code, out, err = run_cli(["export", str(config), "--out", "ship"], root, capfd)
    assert code == 0, out + err
    return root / "ship" / "policy.onnx"


LAYOUTS = ["ppo", "a2c", "sac", "td3", "dqn", "cnn", "cleanrl", "torchscript", "pt2"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_init_fill_run_with_and_without_artifact(layout: str, build_once: Any, tmp_path: Path,
                                                 capfd: Any) -> None:
    root = tmp_path
    if layout == "cleanrl":
        checkpoint, run, zip_name = _cleanrl(root), root, ""
        answers = dict(CLEANRL_ANSWERS)
    else:
        run, zip_name = _subject(layout, build_once)
        checkpoint = run / zip_name
        answers = {"policy.probes.generator": Replace("file", str(run / "probes.npy"))}
    table: dict[str, int] = {}
    plain = _init(root, capfd, checkpoint, f"{layout}-plain")
    fill(plain, answers)
    table["plain"], log = _bless(root, capfd, plain)
    assert table["plain"] == 0, log
    artifact = _ship(layout, root, capfd, plain, run, zip_name)
    shipped = _init(root, capfd, checkpoint, f"{layout}-shipped", "--artifact", str(artifact))
    data = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    assert (shipped.parent / data["policy"]["artifact"]).resolve() == artifact.resolve()
    if layout == "pt2":
        answers["allow_pickle"] = True
    fill(shipped, answers)
    table["--artifact"], log = _bless(root, capfd, shipped)
    assert table["--artifact"] == 0, log
    print(f"init round trip {layout}: {json.dumps(table)}")


def test_init_names_the_artifact_so_a_target_network_export_fails(
        build_once: Any, tmp_path: Path, capfd: Any) -> None:
    """``init dqn.zip --artifact policy.onnx``: the artifact is the config's, so one exported
    from the target network fails export_integrity by name (it was once dropped, and the gate's
    own export passed)."""
    from test_sb3_init_e2e import _dqn_target

    run, zip_name = _subject("dqn", build_once)
    artifact = _dqn_target(run, tmp_path / "ship" / "policy.onnx")
    config = _init(tmp_path, capfd, run / zip_name, "dqn-target", "--artifact", str(artifact))
    fill(config, {"policy.probes.generator": Replace("file", str(run / "probes.npy"))})
    code, log = _bless(tmp_path, capfd, config)
    assert code == 1, log
    report = json.loads((tmp_path / "reports" / "dqn-target" / "report.json").read_text())
    integrity = next(c for c in report["checks"] if c["id"] == "export_integrity")
    assert "target_network_served" in [r.get("finding") for r in integrity["reasons"]]


@pytest.mark.parametrize(("flag", "value"), [("--serving", "."), ("--checkpoint", "2"),
                                             ("--reward-model", "."), ("--reference", ".")])
def test_a_flag_init_cannot_honour_is_bad_input(tmp_path: Path, capfd: Any, flag: str,
                                                value: str) -> None:
    """A policy checkpoint file has no served HF copy, no checkpoint-N, no reward model or KL
    reference: each such flag is exit 2 naming it, and no config is written."""
    checkpoint = _cleanrl(tmp_path)
    code, _, err = run_cli(["init", str(checkpoint), "--out", "configs/x.yaml", flag, value],
                           tmp_path, capfd)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f": {flag}: " in lines[0], err
    assert not (tmp_path / "configs" / "x.yaml").exists()
