"""Subjects of rollout_parity: a Stable-Baselines3 PPO on CartPole-v1 and a continuous torch
actor on Pendulum-v1, each with its gate config (``policy.rollout`` included).

Built once per test run through ``build_once``; the builders only write into their folder.
Their factories and faulty serving functions live in ``rollout_models`` beside this file,
imported through the config's ``python_path`` (so subprocesses find them too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = "rollout_models"
CARTPOLE_STEPS = 2048
"""PPO training steps: long enough that most episodes outlast the first few dozen steps."""


def _probes(path: Path, scale: list[float], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    np.save(path, rng.normal(0, scale, size=(32, len(scale))).astype(np.float32))
    return path


def train_cartpole(folder: Path, seed: int = 0) -> None:
    """PPO on CartPole-v1 behind VecNormalize (seeded); zip, stats JSON, probes, artifact."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from paritygate.adapters.sb3 import save_vecnormalize_stats

    folder.mkdir(parents=True, exist_ok=True)
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=1, seed=seed), norm_obs=True,
                       norm_reward=False)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=4, seed=seed,
                device="cpu", policy_kwargs={"net_arch": [32, 32]})
    model.learn(CARTPOLE_STEPS)
    model.save(folder / "ppo.zip")
    save_vecnormalize_stats(env, folder / "vecnormalize.json")
    env.close()
    _probes(folder / "probes.npy", [1.0, 0.5, 0.1, 0.5])
    export(cartpole_config(folder), folder)


def cartpole_config(clean: Path, **rollout: Any) -> dict[str, Any]:
    """The gate config of the CartPole subject in ``clean`` (artifact there once exported)."""
    artifact = clean / "policy.onnx"
    policy: dict[str, Any] = {
        "training_factory": "paritygate.adapters.sb3:training_policy",
        "inference_factory": "paritygate.adapters.sb3:inference_policy",
        "factory_kwargs": {"obs_dim": 4, "n_actions": 2, "net_arch": [32, 32]},
        "checkpoint": str(clean / "ppo.zip"),
        "training_heads": ["mlp_extractor.value_net", "value_net"],
        "policy_output": "logits",
        "preprocessing": {"training": "paritygate.adapters.sb3:normalize_training",
                          "serving": "paritygate.adapters.sb3:normalize_serving",
                          "stats": str(clean / "vecnormalize.json")},
        "probes": {"file": str(clean / "probes.npy")},
        "rollout": {"env": "CartPole-v1", "episodes": 4, "seed": 0, "max_steps": 200,
                    **rollout},
    }
    if artifact.exists():
        policy["artifact"] = str(artifact)
    return {"name": "cartpole-ppo", "family": "policy", "seed": 0,
            "python_path": [str(HERE)], "policy": policy}


def build_pendulum(folder: Path) -> None:
    """A small deterministic torch actor for Pendulum-v1 (seeded init, no training needed:
    parity holds or not for any weights); checkpoint, probes, artifact."""
    import rollout_models
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = rollout_models.pendulum_training()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "actor.safetensors"))
    _probes(folder / "probes.npy", [0.7, 0.7, 3.0])
    export(pendulum_config(folder), folder)


def pendulum_config(clean: Path, **rollout: Any) -> dict[str, Any]:
    artifact = clean / "policy.onnx"
    policy: dict[str, Any] = {
        "training_factory": f"{MODELS}:pendulum_training",
        "inference_factory": f"{MODELS}:pendulum_inference",
        "checkpoint": str(clean / "actor.safetensors"),
        "training_heads": ["critic"],
        "policy_output": "action",
        "output_names": ["action"],
        "action_space": "continuous",
        "probes": {"file": str(clean / "probes.npy")},
        "rollout": {"env": "Pendulum-v1", "episodes": 3, "seed": 0, "max_steps": 200,
                    **rollout},
    }
    if artifact.exists():
        policy["artifact"] = str(artifact)
    return {"name": "pendulum-actor", "family": "policy", "seed": 0,
            "python_path": [str(HERE)], "policy": policy}


def build_dict_cartpole(folder: Path) -> None:
    """A Dict-observation policy (``pos``, ``vel``) for CartPole behind a Dict wrapper
    (seeded init); checkpoint, probes (one array per key), artifact."""
    import rollout_models
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = rollout_models.dict_cartpole_training()
    with torch.no_grad():
        model.policy_head.weight.mul_(4.0)  # decided actions: margins well above near-ties
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "policy.safetensors"))
    rng = np.random.default_rng(0)
    np.savez(folder / "probes.npz",
             pos=rng.normal(0, [1.0, 0.1], size=(32, 2)).astype(np.float32),
             vel=rng.normal(0, [0.5, 0.5], size=(32, 2)).astype(np.float32))
    export(dict_cartpole_config(folder), folder)


def dict_cartpole_config(clean: Path, **rollout: Any) -> dict[str, Any]:
    """The gate config of the Dict CartPole subject in ``clean``."""
    artifact = clean / "policy.onnx"
    policy: dict[str, Any] = {
        "training_factory": f"{MODELS}:dict_cartpole_training",
        "inference_factory": f"{MODELS}:dict_cartpole_inference",
        "checkpoint": str(clean / "policy.safetensors"),
        "training_heads": ["value_head"],
        "policy_output": "logits",
        "call": "dict",
        "inputs": [
            {"name": "pos", "shape": [2],
             "preprocessing": {"training": f"{MODELS}:scale_pos_training",
                               "serving": f"{MODELS}:scale_pos_serving"}},
            {"name": "vel", "shape": [2],
             "preprocessing": {"training": f"{MODELS}:scale_vel_training",
                               "serving": f"{MODELS}:scale_vel_serving"}},
        ],
        "probes": {"file": str(clean / "probes.npz")},
        "rollout": {"factory": f"{MODELS}:cartpole_dict", "episodes": 4, "seed": 0,
                    "max_steps": 200, **rollout},
    }
    if artifact.exists():
        policy["artifact"] = str(artifact)
    return {"name": "dict-cartpole", "family": "policy", "seed": 0,
            "python_path": [str(HERE)], "policy": policy}


def recurrent_cartpole_config(clean: Path) -> dict[str, Any]:
    """The recurrent demo (``paritygate.demo.shapes.build_recurrent``) in ``clean``, stepped in
    CartPole-v1 taking its four actions."""
    import yaml

    data = yaml.safe_load((clean / "gate.yaml").read_text(encoding="utf-8"))
    for key in ("checkpoint", "artifact"):
        data["policy"][key] = str(clean / data["policy"][key])
    data["python_path"] = [str(HERE)]
    data["policy"]["rollout"] = {"factory": f"{MODELS}:cartpole_four_actions", "episodes": 4,
                                 "seed": 0, "max_steps": 200}
    return data


def export(data: dict[str, Any], folder: Path) -> Path:
    """``paritygate export`` of a subject's config into ``folder`` (policy.onnx + manifest)."""
    from paritygate.families.policy import export_artifact
    from paritygate.load import config_from_dict

    return export_artifact(config_from_dict(data, folder / "gate.yaml"), folder)
