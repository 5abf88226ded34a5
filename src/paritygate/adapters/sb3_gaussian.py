"""Stable-Baselines3 PPO / A2C over a continuous (``Box``) action space as paritygate factories.

The same ``ActorCriticPolicy`` as :mod:`paritygate.adapters.sb3`, with a Gaussian head: the
``action_net`` gives the mean and ``log_std`` is a bare, state-independent parameter (a training
head: the served actor returns the mean). SB3 acts the mean clipped to the action box, so the
distribution is declared ``squash: clip`` with the box's scale and bias::

    training_factory: paritygate.adapters.sb3:gaussian_training_policy   # -> {mean, value}
    inference_factory: paritygate.adapters.sb3:gaussian_inference_policy # actor mean only
    factory_kwargs: {obs_dim: 3, action_low: [-2.0], action_high: [2.0], net_arch: [64, 64]}
    training_heads: [mlp_extractor.value_net, value_net, log_std]
    policy_output: mean
    output_names: [mean]
    action_space: continuous
    distribution: {log_std: parameter, log_std_key: log_std, squash: clip,
                   action_scale: 2.0, action_bias: 0.0}
"""

from __future__ import annotations

import numpy as np
import torch

from paritygate.adapters.sb3_common import NetArch, arch
from paritygate.adapters.sb3_common import gym as sb3_gym
from paritygate.errors import MissingExtra


def _gaussian(obs_dim: int, action_low: list[float], action_high: list[float],
              net_arch: NetArch | None) -> tuple[type, dict[str, object]]:
    gym = sb3_gym()
    try:
        from stable_baselines3.common.policies import ActorCriticPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    kwargs = {"observation_space": gym.spaces.Box(-np.inf, np.inf, shape=(obs_dim,),
                                                  dtype=np.float32),
              "action_space": gym.spaces.Box(np.asarray(action_low, np.float32),
                                             np.asarray(action_high, np.float32),
                                             dtype=np.float32),
              "lr_schedule": lambda _: 0.0, "net_arch": arch(net_arch, [64, 64])}
    return ActorCriticPolicy, kwargs


def gaussian_training_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                             net_arch: NetArch | None = None) -> torch.nn.Module:
    """The whole SB3 ``ActorCriticPolicy`` over a ``Box`` action space (PPO, A2C); forward
    returns ``{"mean", "value"}`` (``log_std`` is the bare parameter beside them)."""
    cls, kwargs = _gaussian(obs_dim, action_low, action_high, net_arch)

    class GaussianTraining(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            latent_pi, latent_vf = self.mlp_extractor(features)
            return {"mean": self.action_net(latent_pi), "value": self.value_net(latent_vf)}

    return GaussianTraining(**kwargs)


def gaussian_inference_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                              net_arch: NetArch | None = None) -> torch.nn.Module:
    """The actor's mean path (value network and ``log_std`` removed); forward returns the
    mean."""
    cls, kwargs = _gaussian(obs_dim, action_low, action_high, net_arch)

    class GaussianInference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            del self.value_net
            del self.mlp_extractor.value_net
            del self.log_std
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            return self.action_net(self.mlp_extractor.forward_actor(features))  # type: ignore[no-any-return]

    return GaussianInference(**kwargs)
