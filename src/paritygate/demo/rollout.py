"""The rollout demo: a small CartPole-v1 policy that ``rollout_parity`` steps in the real
Gymnasium environment, through the training model and through its ONNX artifact.

The policy is built deterministically in well under a second: a seeded tanh layer whose policy
head is fitted (least squares) to a linear controller that balances the pole
(push right when ``0.1 x + 0.5 x_dot + 10 theta + 2 theta_dot > 0``), and a value head only
the training model has. ``build(out_dir)`` writes the checkpoint (safetensors), the exported
ONNX artifact and its manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

OBS_DIM = 4
HIDDEN = 32
GAINS = np.array([0.1, 0.5, 10.0, 2.0])
"""The controller the policy head is fitted to: the sign of ``GAINS @ obs`` picks the push."""
OBS_RANGE = np.array([2.4, 2.0, 0.21, 2.0], dtype=np.float32)
"""Half-widths of the states probes and the fit draw from (CartPole's playing field)."""


class RolloutPolicy(nn.Module):
    """A tanh layer, a two-action policy head and (training only) a value head."""

    def __init__(self, hidden: int = HIDDEN, value_head: bool = True) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.Tanh())
        self.policy_head = nn.Linear(hidden, 2)
        if value_head:
            self.value_head = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        features = self.trunk(obs)  # (N, hidden)
        logits = self.policy_head(features)  # (N, 2)
        if hasattr(self, "value_head"):
            return {"logits": logits, "value": self.value_head(features)}
        return logits


def build_training_model(**kwargs: Any) -> nn.Module:
    return RolloutPolicy(**kwargs)


def build_inference_model(**kwargs: Any) -> nn.Module:
    return RolloutPolicy(value_head=False, **kwargs)


def probe_observations(count: int, seed: int) -> np.ndarray:
    """CartPole states drawn uniformly from the playing field, (count, 4) float32."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1.0, 1.0, (count, OBS_DIM)) * OBS_RANGE).astype(np.float32)


def fit(model: RolloutPolicy, seed: int = 0) -> RolloutPolicy:
    """Fit the policy head so its logit gap is the controller's ``GAINS @ obs`` (least squares
    over seeded states); deterministic for a seed."""
    torch.manual_seed(seed)
    with torch.no_grad():
        layer = model.trunk[0]
        assert isinstance(layer, nn.Linear)
        layer.weight.mul_(0.5)
        states = torch.from_numpy(probe_observations(4096, seed + 1))
        features = model.trunk(states).double()  # (N, hidden)
        design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], 1)
        target = torch.from_numpy(states.double().numpy() @ GAINS)  # (N,)
        solution = torch.linalg.lstsq(design, target[:, None]).solution[:, 0]
        w, b = solution[:-1].float(), float(solution[-1])
        model.policy_head.weight.copy_(torch.stack([-w / 2, w / 2]))
        model.policy_head.bias.copy_(torch.tensor([-b / 2, b / 2]))
    return model


def build(out_dir: Path, *, seed: int = 0) -> dict[str, Path]:
    """Build, save and export the rollout demo policy into ``out_dir``."""
    from safetensors.torch import save_file

    from paritygate.families.policy.export import export_onnx, write_manifest
    from paritygate.progress import stage

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = fit(RolloutPolicy(), seed)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    ckpt = out_dir / "policy.safetensors"
    save_file(state, str(ckpt))
    inference = RolloutPolicy(value_head=False)
    inference.load_state_dict({k: v for k, v in state.items()
                               if not k.startswith("value_head.")}, strict=True)
    with stage("demo rollout: exporting ONNX"):
        artifact = export_onnx(inference.eval(), torch.zeros(2, OBS_DIM), out_dir / "policy.onnx",
                               input_name="obs", output_names=["logits"])
    manifest = write_manifest(artifact, ckpt, opset=18)
    return {"checkpoint": ckpt, "artifact": artifact, "manifest": manifest}
