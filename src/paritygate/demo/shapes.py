"""Demo policies beyond one tensor in, one out: a Dict observation and a recurrent core.

``MultiInputPolicy`` takes a Gymnasium ``Dict`` observation (``image`` (1, 6, 6),
``vector`` (4,), ``goal`` (4,)) as one dict argument, like Stable-Baselines3's
``MultiInputPolicy``; ``image`` is scaled by 1/255 and ``vector`` standardised, each by a
torch (training) and a numpy (serving) implementation. ``LSTMPolicy`` is a PPO-LSTM actor:
``forward(obs, h, c, episode_start)`` resets its state where an episode starts (as
sb3-contrib's ``RecurrentPPO``) and returns ``(logits, h, c, value)``. ``build_dict`` and
``build_recurrent`` write a checkpoint, the artifact exported by ``paritygate export``'s
code path and a gate config into a folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

IMAGE_SHAPE = (1, 6, 6)
VECTOR_DIM = 4
GOAL_DIM = 4
N_ACTIONS = 4
VECTOR_MEAN = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
VECTOR_STD = np.array([0.5, 2.0, 1.0, 3.0], np.float32)


class MultiInputPolicy(nn.Module):
    """A CNN on ``image``, concatenated with ``vector`` and ``goal``; policy and value heads."""

    def __init__(self, hidden: int = 32, value_head: bool = True) -> None:
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten())
        self.mlp = nn.Sequential(nn.Linear(4 * 4 * 4 + VECTOR_DIM + GOAL_DIM, hidden), nn.Tanh())
        self.policy_head = nn.Linear(hidden, N_ACTIONS)
        if value_head:
            self.value_head = nn.Linear(hidden, 1)

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([self.cnn(obs["image"]), obs["vector"], obs["goal"]], dim=1)
        return self.mlp(x)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        h = self.features(obs)
        if hasattr(self, "value_head"):
            return {"logits": self.policy_head(h), "value": self.value_head(h)}
        return self.policy_head(h)


class KeywordInputPolicy(MultiInputPolicy):
    """The same network, its forward taking each key as its own argument."""

    def forward(self, image: torch.Tensor, vector: torch.Tensor,  # type: ignore[override]
                goal: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        return super().forward({"image": image, "vector": vector, "goal": goal})


def build_keyword_training(**kwargs: Any) -> nn.Module:
    return KeywordInputPolicy(**kwargs)


def build_keyword_inference(**kwargs: Any) -> nn.Module:
    return KeywordInputPolicy(value_head=False, **kwargs)


def build_dict_training(**kwargs: Any) -> nn.Module:
    return MultiInputPolicy(**kwargs)


def build_dict_inference(**kwargs: Any) -> nn.Module:
    return MultiInputPolicy(value_head=False, **kwargs)


def dict_probes(count: int, seed: int) -> dict[str, np.ndarray]:
    """Raw Dict observations: an 8-bit image, a vector and a goal, (count, ...) each."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (count, *IMAGE_SHAPE)).astype(np.float32),
        "vector": (VECTOR_MEAN + VECTOR_STD * rng.standard_normal((count, VECTOR_DIM))
                   ).astype(np.float32),
        "goal": rng.uniform(-1, 1, (count, GOAL_DIM)).astype(np.float32),
    }


def scale_image_training(raw: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(raw, np.float32)) / 255.0


def scale_image_serving(raw: np.ndarray) -> np.ndarray:
    return (np.asarray(raw, np.float32) / np.float32(255.0)).astype(np.float32)


def _stats(stats_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    s = json.loads(Path(stats_path).read_text(encoding="utf-8"))
    return np.asarray(s["mean"], np.float32), np.asarray(s["std"], np.float32)


def normalize_vector_training(raw: np.ndarray, *, stats_path: str | Path) -> torch.Tensor:
    mean, std = _stats(stats_path)
    return (torch.as_tensor(np.asarray(raw, np.float32)) - torch.as_tensor(mean)) / \
        torch.as_tensor(std)


def normalize_vector_serving(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    mean, std = _stats(stats_path)
    return ((np.asarray(raw, np.float32) - mean) / std).astype(np.float32)


def dict_config(folder: Path) -> dict[str, Any]:
    """The gate config of the Dict-observation demo in ``folder`` (paths relative to it)."""
    mod = "paritygate.demo.shapes"
    return {
        "name": "demo-dict-policy",
        "family": "policy",
        "seed": 0,
        "policy": {
            "training_factory": f"{mod}:build_dict_training",
            "inference_factory": f"{mod}:build_dict_inference",
            "checkpoint": "policy.safetensors",
            "artifact": "policy.onnx",
            "training_heads": ["value_head"],
            "policy_output": "logits",
            "call": "dict",
            "inputs": [
                {"name": "image", "shape": list(IMAGE_SHAPE), "preprocessing": {
                    "training": f"{mod}:scale_image_training",
                    "serving": f"{mod}:scale_image_serving"}},
                {"name": "vector", "shape": [VECTOR_DIM], "preprocessing": {
                    "training": f"{mod}:normalize_vector_training",
                    "serving": f"{mod}:normalize_vector_serving",
                    "stats": "vector_norm.json"}},
                {"name": "goal", "shape": [GOAL_DIM]},
            ],
            "output_names": ["logits"],
            "probes": {"generator": f"{mod}:dict_probes", "count": 32, "seed": 0},
        },
        "golden": {"dir": "golden"},
    }


def _write_config(folder: Path, data: dict[str, Any]) -> Path:
    import yaml

    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _save_and_export(folder: Path, model: nn.Module, data: dict[str, Any]) -> Path:
    """Save ``model``'s weights, write the config and export the artifact with the gate's own
    export path (heads removed, eval); returns the config."""
    from safetensors.torch import save_file

    from paritygate.families.policy import export_artifact
    from paritygate.load import load_config

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "policy.safetensors"))
    config = _write_config(folder, data)
    export_artifact(load_config(config), folder)
    return config


def build_dict(folder: Path, *, seed: int = 0) -> Path:
    """The Dict-observation demo: weights, vector stats, artifact, manifest and ``gate.yaml``."""
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vector_norm.json").write_text(json.dumps(
        {"mean": VECTOR_MEAN.tolist(), "std": VECTOR_STD.tolist()}) + "\n", encoding="utf-8")
    return _save_and_export(folder, MultiInputPolicy(), dict_config(folder))


# --- recurrent ------------------------------------------------------------------------------------

OBS_DIM = 4
HIDDEN = 16


class LSTMPolicy(nn.Module):
    """PPO-LSTM actor: an encoder, an ``LSTMCell`` core with a learned initial state (stored
    with the weights, as R2D2 stores its recurrent state) and a policy head.

    ``forward(obs, h, c, episode_start)``: where ``episode_start`` is 1 the state is replaced
    by the initial state before the step. Returns ``(logits, h, c)`` and, with the value
    head, ``value`` after them.
    """

    def __init__(self, obs_dim: int = OBS_DIM, hidden: int = HIDDEN,
                 value_head: bool = True) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.core = nn.LSTMCell(hidden, hidden)
        self.initial_h = nn.Parameter(0.5 * torch.randn(hidden))
        self.initial_c = nn.Parameter(0.5 * torch.randn(hidden))
        self.policy_head = nn.Linear(hidden, N_ACTIONS)
        if value_head:
            self.value_head = nn.Linear(hidden, 1)

    def reset(self, h: torch.Tensor, c: torch.Tensor,
              episode_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = episode_start.unsqueeze(-1)
        return (1 - start) * h + start * self.initial_h, (1 - start) * c + start * self.initial_c

    def step(self, obs: torch.Tensor, h: torch.Tensor,
             c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, c = self.core(self.encoder(obs), (h, c))
        return self.policy_head(h), h, c

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                episode_start: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, c = self.reset(h, c, episode_start)
        logits, h, c = self.step(obs, h, c)
        if hasattr(self, "value_head"):
            return logits, h, c, self.value_head(h)
        return logits, h, c


class GateResetLSTMPolicy(LSTMPolicy):
    """The LSTM actor without an episode-start input: its runtime resets the state (to
    zeros) itself, as the gate does when ``policy.recurrent.episode_start`` is not set."""

    def forward(self, obs: torch.Tensor, h: torch.Tensor,  # type: ignore[override]
                c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits, h, c = self.step(obs, h, c)
        if hasattr(self, "value_head"):
            return logits, h, c, self.value_head(h)
        return logits, h, c


def build_gate_reset_training(**kwargs: Any) -> nn.Module:
    return GateResetLSTMPolicy(**kwargs)


def build_gate_reset_inference(**kwargs: Any) -> nn.Module:
    return GateResetLSTMPolicy(value_head=False, **kwargs)


def build_recurrent_training(**kwargs: Any) -> nn.Module:
    return LSTMPolicy(**kwargs)


def build_recurrent_inference(**kwargs: Any) -> nn.Module:
    return LSTMPolicy(value_head=False, **kwargs)


def recurrent_probes(count: int, seed: int) -> np.ndarray:
    """Raw observations, (count, OBS_DIM)."""
    return np.random.default_rng(seed).standard_normal((count, OBS_DIM)).astype(np.float32)


def recurrent_config(folder: Path) -> dict[str, Any]:
    """The gate config of the recurrent demo in ``folder``."""
    mod = "paritygate.demo.shapes"
    return {
        "name": "demo-recurrent-policy",
        "family": "policy",
        "seed": 0,
        "policy": {
            "training_factory": f"{mod}:build_recurrent_training",
            "inference_factory": f"{mod}:build_recurrent_inference",
            "checkpoint": "policy.safetensors",
            "artifact": "policy.onnx",
            "training_heads": ["value_head"],
            "policy_output": 0,
            "inputs": ["obs", "h_in", "c_in", "episode_start"],
            "output_names": ["logits", "h_out", "c_out"],
            "recurrent": {
                "states": [
                    {"input": "h_in", "output": "h_out", "shape": [HIDDEN]},
                    {"input": "c_in", "output": "c_out", "shape": [HIDDEN]},
                ],
                "episode_start": "episode_start",
                "steps": 12,
                "sequences": 6,
                "reset_every": 5,
            },
            "probes": {"generator": f"{mod}:recurrent_probes", "count": 32, "seed": 0},
        },
        "golden": {"dir": "golden"},
    }


def build_recurrent(folder: Path, *, seed: int = 0) -> Path:
    """The recurrent demo: weights, artifact, manifest and ``gate.yaml``."""
    torch.manual_seed(seed)
    return _save_and_export(folder, LSTMPolicy(), recurrent_config(folder))
