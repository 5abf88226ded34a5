"""A tiny Gymnasium image environment for Stable-Baselines3's ``CnnPolicy``, and a serving-side
pixel scaling that forgot the /255; imported through a gate config's ``python_path``.

``BarEnv``: a 36x36 grey image (uint8, channel first) holding one bright column; the actions
move it left, keep it, or move it right, and the reward is how close it sits to the centre.
Seeded resets put the column at a random place, so seeded episodes are reproducible.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SHAPE = (1, 36, 36)
CENTRE = SHAPE[2] // 2


class BarEnv(gym.Env):  # type: ignore[type-arg]
    """One bright column to steer to the centre of a 36x36 image; 40 steps an episode."""

    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, max_steps: int = 40) -> None:
        self.max_steps = max_steps
        self.x = CENTRE
        self.t = 0

    def _image(self) -> np.ndarray:
        image = np.full(SHAPE, 20, np.uint8)
        image[0, :, self.x] = 230
        image[0, :, min(self.x + 1, SHAPE[2] - 1)] = 120
        return image

    def reset(self, *, seed: int | None = None, options: Any = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(0, SHAPE[2]))
        self.t = 0
        return self._image(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.x = int(np.clip(self.x + int(action) - 1, 0, SHAPE[2] - 1))
        self.t += 1
        reward = 1.0 - abs(self.x - CENTRE) / CENTRE
        return self._image(), reward, False, self.t >= self.max_steps, {}


def make_env(max_steps: int = 40) -> BarEnv:
    return BarEnv(max_steps)


def probes(count: int, seed: int) -> np.ndarray:
    """``count`` images of the environment (the column at random places), uint8."""
    env = BarEnv()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        env.x = int(rng.integers(0, SHAPE[2]))
        out.append(env._image())
    return np.stack(out)


def unscaled_serving(raw: np.ndarray) -> np.ndarray:
    """A serving path that casts the pixels to float but forgot the /255."""
    return np.asarray(raw, np.float32)


class BarDictEnv(gym.ObservationWrapper):  # type: ignore[type-arg]
    """``BarEnv`` as a ``Dict`` observation for ``MultiInputPolicy``: ``{"image": the uint8
    image, "pos": the column's place in [0, 1]}``."""

    def __init__(self) -> None:
        super().__init__(BarEnv())
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, SHAPE, np.uint8),
            "pos": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})

    def observation(self, observation: Any) -> dict[str, np.ndarray]:
        x = np.float32(self.env.unwrapped.x / (SHAPE[2] - 1))
        return {"image": observation, "pos": np.asarray([x], np.float32)}


def make_dict_env() -> BarDictEnv:
    return BarDictEnv()


def dict_probes(count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` observations of ``BarDictEnv``: the images and the column's place."""
    images = probes(count, seed)
    pos = images[:, 0, 0, :].argmax(axis=1).astype(np.float32)[:, None] / (SHAPE[2] - 1)
    return {"image": images, "pos": pos}
