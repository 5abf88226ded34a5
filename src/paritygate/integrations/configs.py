"""Gate configs written from a training run before its first checkpoint exists.

``paritygate init`` reads a saved checkpoint; a callback has to gate the first one, so its config
is written from what the trainer already knows: a TRL/transformers trainer's arguments (its
``output_dir``, sampling fields and precision) and prompts, or a Stable-Baselines3 model object
(its algorithm, spaces and network). Each writer puts ``gate.yaml`` and the files it names
(probes, the trainer's sampling fields) in one folder, with ``golden/`` beside them, and returns
the config's path; every path in it is absolute, so the config runs from any folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["LM_CHECKS", "POLICY_CHECKS", "write_sb3_config", "write_trl_config"]

LM_CHECKS = ("weights_load", "tokenizer_parity", "sampling_config", "logprob_delta")
"""The causal-LM checks a trainer's checkpoint is gated with by default: each runs on CPU in
seconds on a small model, with HF ``generate`` as the serving engine."""
POLICY_CHECKS = ("weights_load", "head_removal", "dropout_off", "logits_agreement",
                 "export_integrity")
"""The policy checks an SB3 checkpoint is gated with by default."""
TRL_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                "max_completion_length", "generation_kwargs")
"""The trainer arguments that are sampling fields (the TRL config mapping of
``sampling_config``); the rest of the arguments are training options."""


class SB3Model(Protocol):
    """What the config is written from: an SB3 algorithm object (``PPO``, ``A2C``, ``DQN``)."""

    observation_space: object
    action_space: object
    policy: object

    def get_env(self) -> object: ...


MIXED_PRECISION = ("mixed-precision training (bf16/fp16 in the trainer's arguments): the trainer "
                   "computes in that dtype over the weights it saves, and each checkpoint is "
                   "served as saved; logprob_delta measures the gap under that precision's tier")
"""Why a mixed-precision trainer's dtype may differ from the saved checkpoint's (the allow
entry :func:`write_trl_config` writes, shown in the report)."""


def _dump(path: Path, data: Mapping[str, object]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _prompts(prompts: Sequence[str] | None, trainer: object) -> list[str]:
    """The probe prompts: given, else the first string prompts of the trainer's dataset."""
    if prompts is None and trainer is not None:
        dataset = getattr(trainer, "train_dataset", None)
        column = dataset["prompt"] if dataset is not None and "prompt" in getattr(
            dataset, "column_names", ()) else []
        prompts = [p for p in list(column)[:8] if isinstance(p, str)]
    found = [p for p in prompts or [] if isinstance(p, str) and p.strip()]
    if not found:
        raise ValueError("no probe prompts: pass prompts=[...] (the trainer's dataset has no "
                         "string 'prompt' column)")
    return found


def write_trl_config(
    args: object,
    *,
    prompts: Sequence[str] | None = None,
    trainer: object = None,
    folder: str | Path | None = None,
    name: str | None = None,
    checks: Sequence[str] = LM_CHECKS,
    max_prompt_tokens: int = 64,
) -> Path:
    """A causal-LM gate over ``args.output_dir`` (a ``TrainingArguments``/``GRPOConfig``),
    written to ``folder`` (default ``<output_dir>/paritygate``) before anything is saved.

    The gated model is the output_dir's latest ``checkpoint-N`` (a callback names each with
    ``--checkpoint``) served as saved, with its own ``generation_config.json``; the training
    side samples with ``args``' sampling fields (written as a TRL config, ``trainer_sampling.yaml``)
    in ``args``' precision; ``prompts`` (default: the trainer's dataset's first 8 string
    prompts) are the probes."""
    output_dir = Path(str(getattr(args, "output_dir", ""))).resolve()
    out = Path(folder).resolve() if folder is not None else output_dir / "paritygate"
    probes = out / "probes.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    probes.write_text("".join(json.dumps({"id": f"p{i}", "text": text}) + "\n"
                              for i, text in enumerate(_prompts(prompts, trainer))),
                      encoding="utf-8")
    spec: dict[str, object] = {"model_dir": str(output_dir), "probes": str(probes),
                            "max_prompt_tokens": max_prompt_tokens, "generation_samples": 1}
    sampling = {k: getattr(args, k) for k in TRL_SAMPLING if getattr(args, k, None) is not None}
    selected = list(checks)
    files: dict[str, object] = {}
    if sampling:
        files = {"training": str(_dump(out / "trainer_sampling.yaml", sampling)),
                 "training_format": "trl"}
        spec["sampling"] = files
    else:  # a plain Trainer samples nothing: no protocol to compare
        selected = [c for c in selected if c != "sampling_config"]
    dtype = "bfloat16" if getattr(args, "bf16", False) else (
        "float16" if getattr(args, "fp16", False) else None)
    if dtype is not None:  # mixed precision: the trainer computes in it (logprob_delta's tier)
        spec["training"] = {"dtype": dtype}
        if sampling:  # ... over the weights it saves, which the checkpoint is served as
            files["allow"] = [{"field": "dtype", "reason": MIXED_PRECISION}]
    return _dump(out / "gate.yaml", {
        "name": name or output_dir.name, "family": "causal_lm", "causal_lm": spec,
        "checks": selected, "golden": {"dir": str(out / "golden")},
    })


def _sb3_policy(model: SB3Model) -> dict[str, object]:
    """Factories, their arguments and the training-only heads of an SB3 model's policy."""
    import gymnasium as gym

    obs, act = model.observation_space, model.action_space
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise ValueError(f"{type(model).__name__}: only flat Box observations are written here "
                         f"(got {obs}); save a checkpoint and run paritygate init on it")
    kwargs: dict[str, object] = {"obs_dim": int(obs.shape[0])}
    arch = getattr(model.policy, "net_arch", None)
    if isinstance(arch, (list, dict)):
        kwargs["net_arch"] = arch
    algo = type(model).__name__
    if algo == "DQN" and isinstance(act, gym.spaces.Discrete):
        return {"training_factory": "paritygate.adapters.sb3:dqn_training_policy",
                "inference_factory": "paritygate.adapters.sb3:dqn_inference_policy",
                "factory_kwargs": {**kwargs, "n_actions": int(act.n)},
                "training_heads": ["q_net_target"], "policy_output": "q_values",
                "output_names": ["q_values"]}
    if algo in ("PPO", "A2C") and isinstance(act, gym.spaces.Discrete):
        return {"training_factory": "paritygate.adapters.sb3:training_policy",
                "inference_factory": "paritygate.adapters.sb3:inference_policy",
                "factory_kwargs": {**kwargs, "n_actions": int(act.n)},
                "training_heads": ["mlp_extractor.value_net", "value_net"],
                "policy_output": "logits"}
    raise ValueError(f"{algo} with a {type(act).__name__} action space: write its config with "
                     "paritygate init from a saved zip (PPO/A2C/DQN with Discrete actions are "
                     "written here)")


def write_sb3_config(
    model: SB3Model,
    save_path: str | Path,
    *,
    folder: str | Path | None = None,
    name: str | None = None,
    checks: Sequence[str] = POLICY_CHECKS,
    probes: object = None,
    artifact: str | Path | None = None,
    n_probes: int = 64,
) -> Path:
    """A policy gate for the zips an SB3 ``model`` saves into ``save_path``, written to
    ``folder`` (default ``<save_path>/paritygate``) before anything is saved.

    ``probes``: observations ``(N, obs_dim)``; default ``n_probes`` drawn from the model's
    environment by a seeded random policy (the states the policy meets, not noise).
    ``artifact``: the ONNX file your export step writes (default: the gate exports its own)."""
    import numpy as np

    save_path = Path(save_path).resolve()
    out = Path(folder).resolve() if folder is not None else save_path / "paritygate"
    out.mkdir(parents=True, exist_ok=True)
    policy = _sb3_policy(model)
    if probes is None:
        probes = _env_observations(model, n_probes)
    np.save(out / "probes.npy", np.asarray(probes, dtype=np.float32))
    policy.update({"checkpoint": str(save_path), "probes": {"file": str(out / "probes.npy")}})
    if artifact is not None:
        policy["artifact"] = str(Path(artifact).resolve())
    return _dump(out / "gate.yaml", {
        "name": name or f"{type(model).__name__.lower()}-{save_path.name}", "family": "policy",
        "policy": policy, "checks": list(checks), "golden": {"dir": str(out / "golden")},
    })


def _env_observations(model: SB3Model, count: int) -> object:
    """``count`` observations of a fresh copy of the model's environment under seeded random
    actions (the training environment itself is left untouched)."""
    import gymnasium as gym
    import numpy as np

    vec = model.get_env()
    spec = getattr((getattr(vec, "envs", None) or [None])[0], "spec", None)
    if spec is None:
        raise ValueError("the model's environment has no gymnasium spec to copy: pass "
                         "probes=(N, obs_dim) observations")
    env = gym.make(spec.id)  # the registered env, without the training wrappers
    env.action_space.seed(0)
    rows: list[np.ndarray] = []
    obs, _ = env.reset(seed=0)
    while len(rows) < count:
        rows.append(np.asarray(obs, dtype=np.float32))
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(rows)
