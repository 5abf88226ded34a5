"""Stable-Baselines3 DQN and TD3/DDPG policies as paritygate factories.

Like :mod:`paritygate.adapters.sb3`, the policies are rebuilt from the spaces given in the gate
config and loaded from the zip's ``policy.pth`` (``weights_only``); nothing is unpickled.

DQN (``DQNPolicy``): the online Q-network ``q_net`` is the policy (greedy action = argmax of its
Q-values); ``q_net_target`` is a training-only copy::

    training_factory: paritygate.adapters.sb3:dqn_training_policy    # -> {q_values, target_q}
    inference_factory: paritygate.adapters.sb3:dqn_inference_policy  # q_net only -> q_values
    factory_kwargs: {obs_dim: 4, n_actions: 2, net_arch: [64, 64]}
    training_heads: [q_net_target]
    policy_output: q_values
    output_names: [q_values]

TD3 and DDPG (``TD3Policy``; DDPG is TD3 with one critic): a deterministic actor whose last
layer is a tanh; SB3 acts ``low + (tanh(u) + 1) / 2 * (high - low)``, i.e. ``bias + scale *
tanh(u)``. The training forward returns the actor's pre-tanh output ``u`` so a serving side that
drops the tanh is named (``squash_missing``)::

    training_factory: paritygate.adapters.sb3:td3_training_policy    # -> {pre_tanh, q}
    inference_factory: paritygate.adapters.sb3:td3_inference_policy  # actor only -> pre_tanh
    factory_kwargs: {obs_dim: 3, action_low: [-2.0], action_high: [2.0], net_arch: [400, 300]}
    training_heads: [actor_target, critic, critic_target]
    policy_output: pre_tanh
    output_names: [pre_tanh]
    action_space: continuous
    distribution: {type: deterministic, squash: tanh, action_scale: 2.0, action_bias: 0.0}
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch

from paritygate.adapters.sb3_common import NetArch, arch
from paritygate.errors import MissingExtra

if TYPE_CHECKING:
    from stable_baselines3.td3.policies import Actor


def _spaces() -> ModuleType:
    try:
        import gymnasium as gym
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    return gym.spaces


def _dqn(obs_dim: int, n_actions: int, net_arch: NetArch | None
         ) -> tuple[type, dict[str, object]]:
    spaces = _spaces()
    try:
        from stable_baselines3.dqn.policies import DQNPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    kwargs = {"observation_space": spaces.Box(-np.inf, np.inf, shape=(obs_dim,),
                                              dtype=np.float32),
              "action_space": spaces.Discrete(n_actions), "lr_schedule": lambda _: 0.0,
              "net_arch": arch(net_arch, [64, 64])}
    return DQNPolicy, kwargs


def dqn_training_policy(obs_dim: int, n_actions: int, net_arch: NetArch | None = None
                        ) -> torch.nn.Module:
    """The whole SB3 ``DQNPolicy``; forward returns ``{"q_values", "target_q"}`` (the online
    network's Q-values, the policy, and the target network's)."""
    cls, kwargs = _dqn(obs_dim, n_actions, net_arch)

    class DQNTraining(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            return {"q_values": self.q_net(obs), "target_q": self.q_net_target(obs)}

    return DQNTraining(**kwargs)


def dqn_inference_policy(obs_dim: int, n_actions: int, net_arch: NetArch | None = None
                         ) -> torch.nn.Module:
    """The online Q-network alone (``q_net_target`` removed); forward returns its Q-values."""
    cls, kwargs = _dqn(obs_dim, n_actions, net_arch)

    class DQNInference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            self.q_net_target = None
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return self.q_net(obs)  # type: ignore[no-any-return]

    return DQNInference(**kwargs)


def _td3(obs_dim: int, action_low: list[float], action_high: list[float],
         net_arch: NetArch | None, n_critics: int) -> tuple[type, dict[str, object]]:
    spaces = _spaces()
    try:
        from stable_baselines3.td3.policies import TD3Policy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    kwargs = {"observation_space": spaces.Box(-np.inf, np.inf, shape=(obs_dim,),
                                              dtype=np.float32),
              "action_space": spaces.Box(np.asarray(action_low, np.float32),
                                         np.asarray(action_high, np.float32), dtype=np.float32),
              "lr_schedule": lambda _: 0.0,
              "net_arch": arch(net_arch, [400, 300]),
              "n_critics": n_critics}
    return TD3Policy, kwargs


def _pre_tanh(actor: Actor, obs: torch.Tensor) -> torch.Tensor:
    """The actor's output before its final tanh (SB3 builds ``mu`` ending in ``nn.Tanh``)."""
    if not isinstance(actor.mu[-1], torch.nn.Tanh):
        raise TypeError("the TD3 actor's last layer is not a tanh")
    features = actor.extract_features(obs, actor.features_extractor)
    return actor.mu[:-1](features)  # type: ignore[no-any-return]


def td3_training_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                        net_arch: NetArch | None = None, n_critics: int = 2
                        ) -> torch.nn.Module:
    """The whole SB3 ``TD3Policy`` (DDPG: ``n_critics=1``); forward returns ``{"pre_tanh",
    "q"}``: the actor's output before its tanh, and the first critic's Q of its action."""
    cls, kwargs = _td3(obs_dim, action_low, action_high, net_arch, n_critics)

    class TD3Training(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            pre_tanh = _pre_tanh(self.actor, obs)
            return {"pre_tanh": pre_tanh,
                    "q": self.critic.q1_forward(obs, torch.tanh(pre_tanh))}

    return TD3Training(**kwargs)


def td3_inference_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                         net_arch: NetArch | None = None, n_critics: int = 2
                        ) -> torch.nn.Module:
    """The actor of the same policy (its target and the critics removed); forward returns the
    pre-tanh action ``u`` (the env action is ``bias + scale * tanh(u)``)."""
    cls, kwargs = _td3(obs_dim, action_low, action_high, net_arch, n_critics)

    class TD3Inference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            self.actor_target = self.critic = self.critic_target = None
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return _pre_tanh(self.actor, obs)

    return TD3Inference(**kwargs)
