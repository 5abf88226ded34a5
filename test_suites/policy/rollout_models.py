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


def cartpole_four_actions(**kwargs: Any) -> Any:
    """CartPole-v1 taking four actions (action % 2 pushes the cart): the recurrent demo's
    four logits steer it."""
    import gymnasium

    class FourActions(gymnasium.ActionWrapper):  # type: ignore[misc]
        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.action_space = gymnasium.spaces.Discrete(4)

        def action(self, action: Any) -> int:
            return int(action) % 2

    return FourActions(gymnasium.make("CartPole-v1", **kwargs))


def cartpole_dict(**kwargs: Any) -> Any:
    """CartPole-v1 observing a Dict: ``pos`` (cart position, pole angle) and ``vel`` (their
    velocities)."""
    import gymnasium

    class DictObservation(gymnasium.ObservationWrapper):  # type: ignore[misc]
        def __init__(self, env: Any) -> None:
            super().__init__(env)
            box = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
            self.observation_space = gymnasium.spaces.Dict({"pos": box, "vel": box})

        def observation(self, obs: Any) -> dict[str, np.ndarray]:
            obs = np.asarray(obs, np.float32)
            return {"pos": obs[[0, 2]], "vel": obs[[1, 3]]}

    return DictObservation(gymnasium.make("CartPole-v1", **kwargs))


# --- a Dict-observation policy for cartpole_dict -----------------------------------------------

POS_SCALE = np.array([2.4, 0.21], np.float32)
VEL_SCALE = np.array([1.0, 1.5], np.float32)


class DictCartPolePolicy(nn.Module):
    """forward({"pos": ..., "vel": ...}) -> {logits, value} (the actor alone: logits)."""

    def __init__(self, hidden: int = 16, value_head: bool = True) -> None:
        super().__init__()
        self.pos = nn.Sequential(nn.Linear(2, hidden), nn.Tanh())
        self.vel = nn.Sequential(nn.Linear(2, hidden), nn.Tanh())
        self.policy_head = nn.Linear(2 * hidden, 2)
        if value_head:
            self.value_head = nn.Linear(2 * hidden, 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> Any:
        features = torch.cat([self.pos(obs["pos"]), self.vel(obs["vel"])], dim=-1)
        logits = self.policy_head(features)
        if hasattr(self, "value_head"):
            return {"logits": logits, "value": self.value_head(features)}
        return logits


def dict_cartpole_training(**kwargs: Any) -> nn.Module:
    return DictCartPolePolicy(value_head=True)


def dict_cartpole_inference(**kwargs: Any) -> nn.Module:
    return DictCartPolePolicy(value_head=False)


def scale_pos_training(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(raw) / torch.from_numpy(POS_SCALE)


def scale_pos_serving(raw: np.ndarray) -> np.ndarray:
    return raw / POS_SCALE


def scale_vel_training(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(raw) / torch.from_numpy(VEL_SCALE)


def scale_vel_serving(raw: np.ndarray) -> np.ndarray:
    return raw / VEL_SCALE


def scale_vel_serving_stale(raw: np.ndarray) -> np.ndarray:
    """The pole's angular velocity scaled by last release's 0.5 instead of 1.5."""
    return raw / np.array([1.0, 0.5], np.float32)
