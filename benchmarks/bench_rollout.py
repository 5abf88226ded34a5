"""Cost of the rollout_parity check against the minimal work it cannot avoid.

Minimal work: step the same episodes (same reset seeds, same step limit) of the environment
with both policies, one observation per step: the training preprocessing and the training
model's forward (torch, eval, no autograd), and the serving preprocessing and the artifact
(ONNX Runtime), each taking the argmax action. rollout_parity does that plus recording each
path's trajectory, the margins, the comparison and the report rows. Both run in this
process, alternately, on a Stable-Baselines3 PPO policy trained on CartPole-v1 here (seeded,
not the demo), with models loaded once; the ratios of medians and of minima are printed
(target <= 1.3).

    python benchmarks/bench_rollout.py [--repeats 7] [--episodes 8] [--subject DIR]

``--subject DIR`` keeps the trained policy, its artifact and a gate config (``DIR/gate.yaml``)
there (trained only when missing), so the whole process can be timed against its minimal
counterpart: ``paritygate run DIR/gate.yaml --check rollout_parity`` against
``python benchmarks/bench_rollout.py --minimal-process DIR`` (imports, loading the
checkpoint and the artifact, the same episodes).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from paired import paired_times

OBS_SCALE = [1.0, 0.5, 0.1, 0.5]


def build_subject(folder: Path, episodes: int, steps: int = 4096) -> Path:
    """PPO on CartPole-v1 behind VecNormalize, exported, with its gate config."""
    config = folder / "gate.yaml"
    if config.exists():
        return config
    import yaml
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from paritygate.adapters.sb3 import save_vecnormalize_stats
    from paritygate.families.policy import export_artifact
    from paritygate.load import config_from_dict

    folder.mkdir(parents=True, exist_ok=True)
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=1, seed=0), norm_obs=True,
                       norm_reward=False)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=4, seed=0, device="cpu")
    model.learn(steps)
    model.save(folder / "ppo.zip")
    save_vecnormalize_stats(env, folder / "vecnormalize.json")
    env.close()
    rng = np.random.default_rng(0)
    np.save(folder / "probes.npy", rng.normal(0, OBS_SCALE, size=(32, 4)).astype(np.float32))
    data: dict[str, Any] = {
        "name": "bench-rollout", "family": "policy", "checks": ["rollout_parity"],
        "policy": {
            "training_factory": "paritygate.adapters.sb3:training_policy",
            "inference_factory": "paritygate.adapters.sb3:inference_policy",
            "factory_kwargs": {"obs_dim": 4, "n_actions": 2},
            "checkpoint": "ppo.zip",
            "training_heads": ["mlp_extractor.value_net", "value_net"],
            "policy_output": "logits",
            "preprocessing": {"training": "paritygate.adapters.sb3:normalize_training",
                              "serving": "paritygate.adapters.sb3:normalize_serving",
                              "stats": "vecnormalize.json"},
            "probes": {"file": "probes.npy"},
            "rollout": {"env": "CartPole-v1", "episodes": episodes, "seed": 0,
                        "max_steps": 500},
        },
        "golden": {"dir": "golden"},
    }
    export_artifact(config_from_dict(data, config), folder)
    data["policy"]["artifact"] = "policy.onnx"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return config


def minimal_episodes(models: dict[str, Any], seeds: list[int], max_steps: int) -> int:
    """Both paths step every episode: preprocessing, forward, argmax, env.step. Steps taken."""
    import gymnasium as gym
    import torch

    taken = 0
    for path in ("training", "serving"):
        pre, forward = models[path]
        for seed in seeds:
            env = gym.make("CartPole-v1")
            obs, _ = env.reset(seed=seed)
            for _ in range(max_steps):
                x = pre(np.asarray(obs, np.float32)[None])
                with torch.inference_mode():
                    logits = forward(x)
                obs, _, terminated, truncated, _ = env.step(int(np.argmax(logits[0])))
                taken += 1
                if terminated or truncated:
                    break
            env.close()
    return taken


def load_minimal(folder: Path) -> dict[str, Any]:
    """The two paths, loaded the plain way: the SB3 policy from the zip's policy.pth, the
    artifact in an ONNX Runtime session, the normalisers bound to the stats file."""
    import torch

    from paritygate.adapters.sb3 import (
        normalize_serving,
        normalize_training,
        training_policy,
    )
    from paritygate.checkpoints import load_state_dict
    from paritygate.engines.onnxruntime_engine import make_session

    model = training_policy(obs_dim=4, n_actions=2)
    model.load_state_dict(load_state_dict(folder / "ppo.zip", allow_pickle=False))
    model.eval()
    session = make_session(folder / "policy.onnx")
    stats = folder / "vecnormalize.json"

    def torch_forward(x: np.ndarray) -> np.ndarray:
        return model(torch.from_numpy(x))["logits"].numpy()

    return {
        "training": (lambda raw: np.asarray(normalize_training(raw, stats_path=stats),
                                            np.float32), torch_forward),
        "serving": (lambda raw: normalize_serving(raw, stats_path=stats),
                    lambda x: session.run(None, {"obs": x})[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--subject", type=Path, default=None)
    parser.add_argument("--minimal-process", type=Path, default=None,
                        help="run the minimal work once on the subject in DIR and exit")
    args = parser.parse_args()
    if args.minimal_process is not None:
        import yaml

        data = yaml.safe_load((args.minimal_process / "gate.yaml").read_text())
        rollout = data["policy"]["rollout"]
        seeds = [rollout["seed"] + i for i in range(rollout["episodes"])]
        minimal_episodes(load_minimal(args.minimal_process), seeds, rollout["max_steps"])
        return

    import torch

    from paritygate.check import Thresholds
    from paritygate.checks.rollout_parity import CHECK
    from paritygate.families.policy.build import build_policy_context
    from paritygate.load import load_config

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.subject or Path(tmp) / "subject"
        config = load_config(build_subject(folder, args.episodes))
        ctx = build_policy_context(config)
        spec = config.policy.rollout if config.policy else None
        assert spec is not None
        seeds, max_steps = spec.episode_seeds, spec.max_steps
        models = load_minimal(folder)
        thresholds = Thresholds(CHECK.defaults)
        steps = [0]

        def minimal() -> None:
            steps[0] = minimal_episodes(models, seeds, max_steps)

        def check() -> None:
            ctx.__dict__.pop("rollouts", None)  # step the episodes again
            m = CHECK.measures["policy"](ctx, thresholds)
            assert not m.findings, m.findings

        t_min, t_chk = paired_times(minimal, check, args.repeats)
        m_min, m_chk = statistics.median(t_min), statistics.median(t_chk)
        print(f"episodes {len(seeds)} per path, env steps {steps[0]} (both paths), "
              f"repeats {args.repeats}")
        print(f"minimal work (step both policies): {m_min * 1e3:8.1f} ms (median)")
        print(f"rollout_parity check:              {m_chk * 1e3:8.1f} ms (median)")
        print(f"spread: minimal {min(t_min) * 1e3:.1f}-{max(t_min) * 1e3:.1f} ms, "
              f"check {min(t_chk) * 1e3:.1f}-{max(t_chk) * 1e3:.1f} ms")
        # On a shared machine the minimum is the least disturbed run of each side.
        print(f"ratio of medians: {m_chk / m_min:.2f}x, ratio of minima: "
              f"{min(t_chk) / min(t_min):.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
