"""The demo torch policy: an MLP actor-critic with BatchNorm, dropout, value and auxiliary heads.

Trained briefly on a synthetic task so its BatchNorm running statistics are real,
with an observation normaliser whose training implementation is torch and whose
serving implementation is numpy. ``build(out_dir)`` writes the checkpoint
(safetensors), the normaliser stats, the exported ONNX artifact and its manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

OBS_DIM = 8
N_ACTIONS = 4
HIDDEN = 64
# Raw observation scale: feature 5 is nearly constant (tiny variance) so the
# normaliser's epsilon matters, feature 7 is an integer-coded category.
OBS_MEAN = np.array([3.0, -2.0, 0.5, 10.0, 0.0, 1.0, -5.0, 0.0], dtype=np.float32)
OBS_STD = np.array([2.0, 0.5, 1.0, 4.0, 1.0, 0.01, 3.0, 1.0], dtype=np.float32)
DISCRETE_FEATURES = [7]
N_CATEGORIES = 3


class Trunk(nn.Sequential):
    def __init__(self, obs_dim: int = OBS_DIM, hidden: int = HIDDEN, dropout: float = 0.1) -> None:
        super().__init__(
            nn.Linear(obs_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
        )


class TrainingPolicy(nn.Module):
    """Training model: shared trunk, policy head, value head and auxiliary (next-obs) head."""

    def __init__(
        self,
        obs_dim: int = OBS_DIM,
        n_actions: int = N_ACTIONS,
        hidden: int = HIDDEN,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.trunk = Trunk(obs_dim, hidden, dropout)
        self.policy_head = nn.Linear(hidden, n_actions)
        self.value_head = nn.Linear(hidden, 1)
        self.aux_head = nn.Linear(hidden, obs_dim)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(obs)  # (B, H)
        return {
            "logits": self.policy_head(h),
            "value": self.value_head(h).squeeze(-1),
            "aux": self.aux_head(h),
        }


class InferencePolicy(nn.Module):
    """Serving model: the trunk and the policy head only; returns logits (B, A)."""

    def __init__(
        self,
        obs_dim: int = OBS_DIM,
        n_actions: int = N_ACTIONS,
        hidden: int = HIDDEN,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.trunk = Trunk(obs_dim, hidden, dropout)
        self.policy_head = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_head(self.trunk(obs))


def build_training_model(**kwargs: Any) -> nn.Module:
    return TrainingPolicy(**kwargs)


def build_inference_model(**kwargs: Any) -> nn.Module:
    return InferencePolicy(**kwargs)


# --- observation normaliser -------------------------------------------------------------------


def load_stats(stats_path: str | Path) -> dict[str, Any]:
    return json.loads(Path(stats_path).read_text(encoding="utf-8"))


def normalize_training(raw: np.ndarray, *, stats_path: str | Path) -> torch.Tensor:
    """Training-side normaliser (torch): fill NaN with the mean, standardise, clip.

    Discrete features pass through unchanged.
    """
    s = load_stats(stats_path)
    x = torch.as_tensor(np.asarray(raw, dtype=np.float32))  # (N, D)
    mean = torch.tensor(s["mean"], dtype=torch.float32)
    var = torch.tensor(s["var"], dtype=torch.float32)
    x = torch.where(torch.isnan(x), mean.expand_as(x), x)
    z = ((x - mean) / torch.sqrt(var + s["epsilon"])).clamp(-s["clip"], s["clip"])
    for j in s["discrete"]:
        z[:, j] = x[:, j]
    return z


def normalize_serving(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving-side normaliser (numpy), the same contract as :func:`normalize_training`."""
    s = load_stats(stats_path)
    x = np.asarray(raw, dtype=np.float32).copy()  # (N, D)
    mean = np.asarray(s["mean"], dtype=np.float32)
    var = np.asarray(s["var"], dtype=np.float32)
    missing = np.isnan(x)
    x[missing] = np.broadcast_to(mean, x.shape)[missing]
    z = np.clip((x - mean) / np.sqrt(var + np.float32(s["epsilon"])), -s["clip"], s["clip"])
    z[:, s["discrete"]] = x[:, s["discrete"]]
    return z.astype(np.float32)


def probe_observations(count: int, seed: int) -> np.ndarray:
    """Raw observations drawn like the environment's: (count, OBS_DIM) float32."""
    rng = np.random.default_rng(seed)
    x = OBS_MEAN + OBS_STD * rng.standard_normal((count, OBS_DIM)).astype(np.float32)
    x[:, DISCRETE_FEATURES] = rng.integers(0, N_CATEGORIES, size=(count, len(DISCRETE_FEATURES)))
    return x.astype(np.float32)


# --- training -------------------------------------------------------------------------------------


def _task(raw: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic task: the best action is the argmax of a fixed linear score; value = its margin."""
    w = np.random.default_rng(1234).standard_normal((OBS_DIM, N_ACTIONS)).astype(np.float32)
    z = (raw - OBS_MEAN) / OBS_STD
    scores = z @ w
    return scores.argmax(-1), scores.max(-1)


def train(model: TrainingPolicy, stats_path: Path, *, steps: int = 300, seed: int = 0) -> None:
    from paritygate.progress import Progress

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    bar = Progress("demo policy: training", steps)
    for step in range(steps):
        raw = probe_observations(128, seed=seed * 100_000 + step)
        action, value = _task(raw, rng)
        obs = normalize_training(raw, stats_path=stats_path)
        out = model(obs)
        loss = (
            nn.functional.cross_entropy(out["logits"], torch.as_tensor(action))
            + 0.5 * nn.functional.mse_loss(out["value"], torch.as_tensor(value))
            + 0.1 * nn.functional.mse_loss(out["aux"], obs)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.advance()
    bar.close()
    model.eval()


def write_stats(path: Path, *, epsilon: float = 1e-8, clip: float = 10.0) -> Path:
    raw = probe_observations(4096, seed=99)
    stats = {
        "mean": raw.mean(0).astype(float).tolist(),
        "var": raw.var(0).astype(float).tolist(),
        "epsilon": epsilon,
        "clip": clip,
        "discrete": DISCRETE_FEATURES,
    }
    for j in DISCRETE_FEATURES:
        stats["mean"][j], stats["var"][j] = 0.0, 1.0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return path


def inference_state(
    training_state: dict[str, torch.Tensor], heads: tuple[str, ...] = ("value_head", "aux_head")
) -> dict[str, torch.Tensor]:
    """The training state without the training-only heads."""
    return {k: v for k, v in training_state.items() if k.split(".")[0] not in heads}


def build(out_dir: Path, *, seed: int = 0, steps: int = 300) -> dict[str, Path]:
    """Train, save and export the demo policy into ``out_dir``; deterministic for a seed."""
    from safetensors.torch import save_file

    from paritygate.families.policy.export import export_onnx, write_manifest
    from paritygate.progress import stage

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    stats = write_stats(out_dir / "obs_norm.json")
    model = TrainingPolicy()
    train(model, stats, steps=steps, seed=seed)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    ckpt = out_dir / "policy.safetensors"
    save_file(state, str(ckpt))
    inference = InferencePolicy()
    inference.load_state_dict(inference_state(state), strict=True)
    inference.eval()
    example = torch.zeros(2, OBS_DIM)
    with stage("demo policy: exporting ONNX"):
        artifact = export_onnx(
            inference, example, out_dir / "policy.onnx", input_name="obs", output_names=["logits"]
        )
    manifest = write_manifest(artifact, ckpt, opset=18)
    return {"checkpoint": ckpt, "stats": stats, "artifact": artifact, "manifest": manifest}
