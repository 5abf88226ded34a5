"""A small Gymnasium ``Dict`` environment for Stable-Baselines3's ``MultiInputPolicy``, and a
faulty serving normaliser; imported through a gate config's ``python_path``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

KEYS = {"pos": [2], "vel": [2]}
"""The observation keys and their shapes: CartPole's (x, theta) and (x_dot, theta_dot)."""


class SplitCartPole(gym.ObservationWrapper):  # type: ignore[type-arg]
    """CartPole-v1 with its observation split into ``{"pos": (x, theta), "vel": (x_dot,
    theta_dot)}``."""

    def __init__(self, env: gym.Env | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(env if env is not None else gym.make("CartPole-v1"))
        box = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.observation_space = gym.spaces.Dict({"pos": box, "vel": box})

    def observation(self, observation: Any) -> dict[str, np.ndarray]:
        obs = np.asarray(observation, np.float32)
        return {"pos": obs[[0, 2]], "vel": obs[[1, 3]]}


def make_env() -> gym.Env:  # type: ignore[type-arg]
    return SplitCartPole()


def raw_serving(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """A serving stack that forgot this key's normalisation: the raw input."""
    return np.asarray(raw, np.float32)
