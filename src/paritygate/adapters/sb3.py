"""Stable-Baselines3 actor-critic policies as paritygate factories.

SB3 saves ``policy.pth`` (the ``ActorCriticPolicy`` state dict) inside its zip;
paritygate reads it with ``weights_only=True``. These factories rebuild the
policy from spaces given in the gate config, so nothing from the zip is
unpickled. The training model returns the action logits and the value; the
inference model keeps only the actor path (``mlp_extractor.policy_net`` and
``action_net``), so the training-only heads are ``mlp_extractor.value_net`` and
``value_net``.

Config::

    training_factory: paritygate.adapters.sb3:training_policy
    inference_factory: paritygate.adapters.sb3:inference_policy
    factory_kwargs: {obs_dim: 4, n_actions: 2, net_arch: [64, 64]}
    checkpoint: ppo_cartpole.zip
    training_heads: [mlp_extractor.value_net, value_net]
    policy_output: logits
"""

from __future__ import annotations

from typing import Any

import torch

from paritygate.errors import MissingExtra


def _policy_class() -> Any:
    try:
        import gymnasium as gym
        from stable_baselines3.common.policies import ActorCriticPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    return gym, ActorCriticPolicy


def _build(obs_dim: int, n_actions: int, net_arch: list[int] | None) -> Any:
    gym, policy_cls = _policy_class()
    import numpy as np

    obs_space = gym.spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
    act_space = gym.spaces.Discrete(n_actions)
    arch = list(net_arch) if net_arch is not None else [64, 64]
    return policy_cls, obs_space, act_space, arch


def training_policy(obs_dim: int, n_actions: int, net_arch: list[int] | None = None) -> Any:
    """The whole SB3 ``ActorCriticPolicy``; forward returns ``{"logits", "value"}``."""
    policy_cls, obs_space, act_space, arch = _build(obs_dim, n_actions, net_arch)

    class TrainingPolicy(policy_cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            latent_pi, latent_vf = self.mlp_extractor(features)
            return {"logits": self.action_net(latent_pi), "value": self.value_net(latent_vf)}

    return TrainingPolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch)


def inference_policy(obs_dim: int, n_actions: int, net_arch: list[int] | None = None) -> Any:
    """The actor path of the same policy (value network removed); forward returns logits."""
    policy_cls, obs_space, act_space, arch = _build(obs_dim, n_actions, net_arch)

    class InferencePolicy(policy_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            del self.value_net
            del self.mlp_extractor.value_net
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            return self.action_net(self.mlp_extractor.forward_actor(features))

    return InferencePolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch)
