"""Factories and serving functions of the rollout_parity subjects (``rollout_subjects``).

The Pendulum actor outputs its action directly (a torque, clipped to [-2, 2] by the gate);
its training model also carries a critic. The faulty serving normalisers are what a serving
stack gets wrong about SB3's VecNormalize statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from paritygate.adapters.sb3 import normalize_serving


class PendulumActor(nn.Module):
    def __init__(self, hidden: int = 32, critic: bool = True) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        if critic:
            self.critic = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor) -> Any:
        action = 3.0 * self.actor(obs)  # a torque; beyond +-2 the gate clips it
        if hasattr(self, "critic"):
            return {"action": action, "value": self.critic(obs)}
        return action


def pendulum_training(**kwargs: Any) -> nn.Module:
    return PendulumActor(critic=True)


def pendulum_inference(**kwargs: Any) -> nn.Module:
    return PendulumActor(critic=False)


def normalize_serving_stale_velocity(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser with last release's statistics for the pole's angular velocity
    (its mean off by 0.3 standard deviations)."""
    out = normalize_serving(raw, stats_path=stats_path)
    out[..., 3] += np.float32(0.3)
    return out


def nan_action_serving(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser that marks the cart's velocity missing (NaN) below -0.3, where the
    serving stack's sensor range ends: the artifact's outputs are NaN there."""
    out = normalize_serving(raw, stats_path=stats_path)
    out[raw[..., 1] < -0.3, 1] = np.nan
    return out


_RESETS = [0]


def unseeded_cartpole(**kwargs: Any) -> Any:
    """CartPole whose reset ignores the seed it is given (a wrapper reseeding from a counter):
    the two paths start from different states."""
    import gymnasium as gym

    class IgnoresSeed(gym.Wrapper):  # type: ignore[misc]
        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            _RESETS[0] += 1
            return self.env.reset(seed=1000 + _RESETS[0], options=options)

    return IgnoresSeed(gym.make("CartPole-v1", **kwargs))
