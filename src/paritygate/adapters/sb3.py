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
    preprocessing:                 # VecNormalize observation statistics, saved as JSON
      training: paritygate.adapters.sb3:normalize_training   # SB3's own VecNormalize code
      serving: paritygate.adapters.sb3:normalize_serving     # float32 numpy, as served
      stats: vecnormalize.json     # written by save_vecnormalize_stats(vec_env, path)

SAC (continuous actions, ``SACPolicy``): ``sac_training_policy`` returns the actor's
Gaussian (``mean``, ``log_std``, clamped to [-20, 2] by SB3) and the first critic's Q;
``sac_inference_policy`` keeps the actor alone, so the training-only heads are ``critic``
and ``critic_target``::

    training_factory: paritygate.adapters.sb3:sac_training_policy
    inference_factory: paritygate.adapters.sb3:sac_inference_policy
    factory_kwargs: {obs_dim: 3, action_low: [-2.0], action_high: [2.0], net_arch: [64, 64]}
    checkpoint: sac_pendulum.zip
    training_heads: [critic, critic_target]
    policy_output: mean
    output_names: [mean, log_std]
    action_space: continuous
    distribution: {log_std: output, log_std_key: log_std, log_std_clamp: [-20, 2],
                   squash: tanh, action_scale: 2.0, action_bias: 0.0}

PPO / A2C over a ``Box`` action space (:mod:`paritygate.adapters.sb3_gaussian`:
``gaussian_training_policy``), DQN, TD3/DDPG (:mod:`paritygate.adapters.sb3_offpolicy`) and
``CnnPolicy`` (:mod:`paritygate.adapters.sb3_cnn`) have factories of their own, importable
from here too: ``dqn_training_policy``, ``td3_training_policy``, ``cnn_training_policy`` and
their ``*_inference_policy``.

``save_vecnormalize_stats`` writes the running mean/var, epsilon and clip of a
``VecNormalize`` to JSON, so the gate never unpickles SB3's ``vecnormalize.pkl``.

``multi_input_training_policy`` / ``multi_input_inference_policy``: a ``MultiInputPolicy``
(``CombinedExtractor`` over a ``Dict`` of float ``Box`` keys), ``factory_kwargs: {spaces:
{pos: [2], vel: [2]}, n_actions: 2}``, called with ``call: dict``.

``recurrent_training_policy`` / ``recurrent_inference_policy`` do the same for sb3-contrib's
``RecurrentPPO`` (``MlpLstmPolicy``): ``forward(obs, h, c, episode_start) -> (logits, h, c)``,
the training-only heads ``value_net``, ``mlp_extractor.value_net`` and ``lstm_critic``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch

from paritygate.adapters.sb3_common import NetArch, arch
from paritygate.adapters.sb3_common import gym as sb3_gym
from paritygate.errors import MissingExtra

if TYPE_CHECKING:
    from gymnasium.spaces import Space
    from stable_baselines3.common.vec_env import VecNormalize



class VecNormalizeStats(TypedDict):
    """What :func:`save_vecnormalize_stats` writes: a ``VecNormalize``'s observation side."""

    mean: list[float]
    var: list[float]
    count: float
    epsilon: float
    clip_obs: float
    norm_obs: bool


def _policy_class() -> tuple[ModuleType, type]:
    gym = sb3_gym()
    try:
        from stable_baselines3.common.policies import ActorCriticPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    return gym, ActorCriticPolicy


def _build(obs_dim: int, n_actions: int, net_arch: NetArch | None
           ) -> tuple[type, Space[np.ndarray], Space[np.int64], NetArch]:
    gym, policy_cls = _policy_class()
    obs_space = gym.spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
    act_space = gym.spaces.Discrete(n_actions)
    return policy_cls, obs_space, act_space, arch(net_arch, [64, 64])


def training_policy(obs_dim: int, n_actions: int, net_arch: NetArch | None = None
                    ) -> torch.nn.Module:
    """The whole SB3 ``ActorCriticPolicy`` (PPO, A2C); forward returns ``{"logits", "value"}``.
    ``net_arch``: a list for both sides or ``{pi: [...], vf: [...]}`` (A2C/PPO's own)."""
    policy_cls, obs_space, act_space, arch_ = _build(obs_dim, n_actions, net_arch)

    class TrainingPolicy(policy_cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            latent_pi, latent_vf = self.mlp_extractor(features)
            return {"logits": self.action_net(latent_pi), "value": self.value_net(latent_vf)}

    return TrainingPolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch_)


def inference_policy(obs_dim: int, n_actions: int, net_arch: NetArch | None = None
                     ) -> torch.nn.Module:
    """The actor path of the same policy (value network removed); forward returns logits."""
    policy_cls, obs_space, act_space, arch_ = _build(obs_dim, n_actions, net_arch)

    class InferencePolicy(policy_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            del self.value_net
            del self.mlp_extractor.value_net
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            features = self.extract_features(obs, self.pi_features_extractor)
            return self.action_net(self.mlp_extractor.forward_actor(features))

    return InferencePolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch_)


a2c_training_policy = training_policy
"""A2C's ``MlpPolicy`` is PPO's ``ActorCriticPolicy`` (RMSprop is the optimizer's business, not
the network's): the same factories, under the algorithm's name."""
a2c_inference_policy = inference_policy


def _multi_input(spaces: dict[str, list[int]], n_actions: int, net_arch: NetArch | None,
                 image_keys: list[str] | None, normalize_images: bool, cnn_output_dim: int
                 ) -> tuple[type, dict[str, object]]:
    try:
        import gymnasium as gym
        from stable_baselines3.common.policies import MultiInputActorCriticPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    if not isinstance(spaces, dict) or not spaces:
        raise ValueError("spaces must map each observation key to its shape, e.g. "
                         "{pos: [2], vel: [2]}")
    images = set(image_keys or ())
    if images - set(spaces):
        raise ValueError(f"image_keys {sorted(images - set(spaces))} are not keys of spaces")
    obs_space = gym.spaces.Dict({
        key: gym.spaces.Box(0, 255, shape=tuple(int(d) for d in shape), dtype=np.uint8)
        if key in images else
        gym.spaces.Box(-np.inf, np.inf, shape=tuple(int(d) for d in shape), dtype=np.float32)
        for key, shape in spaces.items()})
    kwargs = {"observation_space": obs_space, "action_space": gym.spaces.Discrete(n_actions),
              "lr_schedule": lambda _: 0.0, "net_arch": arch(net_arch, [64, 64]),
              "normalize_images": normalize_images,
              "features_extractor_kwargs": {"cnn_output_dim": cnn_output_dim}}
    return MultiInputActorCriticPolicy, kwargs


def multi_input_training_policy(spaces: dict[str, list[int]], n_actions: int,
                                net_arch: NetArch | None = None,
                                image_keys: list[str] | None = None,
                                normalize_images: bool = True,
                                cnn_output_dim: int = 256) -> torch.nn.Module:
    """The whole SB3 ``MultiInputActorCriticPolicy`` (PPO/A2C ``MultiInputPolicy``, its
    ``CombinedExtractor``) over a ``Dict`` of ``Box`` spaces, ``spaces`` mapping each key
    to its shape; ``image_keys`` are uint8 images (C, H, W) the extractor runs a NatureCNN on,
    scaled by 1/255 inside unless ``normalize_images`` is false (then the scaling is declared
    preprocessing: :func:`paritygate.adapters.sb3_cnn.scale_images_training`), each to
    ``cnn_output_dim`` features, the others float vectors; ``forward(obs_dict)`` returns
    ``{"logits", "value"}``."""
    cls, kwargs = _multi_input(spaces, n_actions, net_arch, image_keys, normalize_images,
                               cnn_output_dim)

    class MultiInputTraining(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: dict[str, torch.Tensor]  # type: ignore[override]
                    ) -> dict[str, torch.Tensor]:
            features = self.extract_features(obs, self.pi_features_extractor)
            latent_pi, latent_vf = self.mlp_extractor(features)
            return {"logits": self.action_net(latent_pi), "value": self.value_net(latent_vf)}

    return MultiInputTraining(**kwargs)


def multi_input_inference_policy(spaces: dict[str, list[int]], n_actions: int,
                                 net_arch: NetArch | None = None,
                                 image_keys: list[str] | None = None,
                                 normalize_images: bool = True,
                                 cnn_output_dim: int = 256) -> torch.nn.Module:
    """The actor path of the same policy (value network removed); ``forward(obs_dict)``
    returns the logits."""
    cls, kwargs = _multi_input(spaces, n_actions, net_arch, image_keys, normalize_images,
                               cnn_output_dim)

    class MultiInputInference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            del self.value_net
            del self.mlp_extractor.value_net
            self.optimizer = None

        def forward(self, obs: dict[str, torch.Tensor]  # type: ignore[override]
                    ) -> torch.Tensor:
            features = self.extract_features(obs, self.pi_features_extractor)
            return self.action_net(self.mlp_extractor.forward_actor(features))

    return MultiInputInference(**kwargs)


def _recurrent_class() -> type:
    try:
        from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
    except ImportError:
        raise MissingExtra("sb3-contrib", "sb3") from None
    return RecurrentActorCriticPolicy


def _recurrent(obs_dim: int, n_actions: int, lstm_hidden_size: int,
               net_arch: NetArch | None) -> tuple[type, dict[str, object]]:
    _, obs_space, act_space, arch_ = _build(obs_dim, n_actions, net_arch)
    kwargs = {"observation_space": obs_space, "action_space": act_space,
              "lr_schedule": lambda _: 0.0, "net_arch": arch_,
              "lstm_hidden_size": lstm_hidden_size}
    return _recurrent_class(), kwargs


def recurrent_training_policy(obs_dim: int, n_actions: int, lstm_hidden_size: int = 256,
                              net_arch: NetArch | None = None) -> torch.nn.Module:
    """sb3-contrib's whole ``RecurrentActorCriticPolicy`` (``RecurrentPPO``'s
    ``MlpLstmPolicy``, one LSTM layer); ``forward(obs, h, c, episode_start)`` runs the actor
    through the library's own ``_process_sequence`` (its episode-start reset) and returns
    ``(logits, h, c)``, the state per row ``(batch, lstm_hidden_size)``."""
    cls, kwargs = _recurrent(obs_dim, n_actions, lstm_hidden_size, net_arch)

    class RecurrentTraining(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor, h: torch.Tensor,  # type: ignore[override]
                    c: torch.Tensor, episode_start: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            features = self.extract_features(obs, self.pi_features_extractor)
            latent, (h_n, c_n) = self._process_sequence(
                features, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()),
                episode_start, self.lstm_actor)
            logits = self.action_net(self.mlp_extractor.forward_actor(latent))
            return logits, h_n[0], c_n[0]

    return RecurrentTraining(**kwargs)


def recurrent_inference_policy(obs_dim: int, n_actions: int, lstm_hidden_size: int = 256,
                               net_arch: NetArch | None = None) -> torch.nn.Module:
    """The actor path of the same recurrent policy (critic LSTM and value network removed), one
    step written out for the exporter: reset where ``episode_start`` is 1, one LSTM step,
    ``(logits, h, c)``."""
    cls, kwargs = _recurrent(obs_dim, n_actions, lstm_hidden_size, net_arch)

    class RecurrentInference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            del self.value_net
            del self.mlp_extractor.value_net
            del self.lstm_critic
            self.optimizer = None

        def forward(self, obs: torch.Tensor, h: torch.Tensor,  # type: ignore[override]
                    c: torch.Tensor, episode_start: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            features = self.extract_features(obs, self.pi_features_extractor)
            keep = (1.0 - episode_start).view(1, -1, 1)
            out, (h_n, c_n) = self.lstm_actor(
                features.unsqueeze(0), (keep * h.unsqueeze(0), keep * c.unsqueeze(0)))
            logits = self.action_net(self.mlp_extractor.forward_actor(out[0]))
            return logits, h_n[0], c_n[0]

    return RecurrentInference(**kwargs)

def _sac_build(obs_dim: int, action_low: list[float], action_high: list[float],
               net_arch: NetArch | None
               ) -> tuple[type, Space[np.ndarray], Space[np.ndarray], NetArch]:
    try:
        import gymnasium as gym
        from stable_baselines3.sac.policies import SACPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    obs_space = gym.spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
    act_space = gym.spaces.Box(np.asarray(action_low, np.float32),
                               np.asarray(action_high, np.float32), dtype=np.float32)
    return SACPolicy, obs_space, act_space, arch(net_arch, [256, 256])


def sac_training_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                        net_arch: NetArch | None = None) -> torch.nn.Module:
    """The whole SB3 ``SACPolicy``; forward returns ``{"mean", "log_std", "q"}`` (the actor's
    pre-squash Gaussian and the first critic's Q of its deterministic action)."""
    policy_cls, obs_space, act_space, arch_ = _sac_build(obs_dim, action_low, action_high,
                                                         net_arch)

    class SACTrainingPolicy(policy_cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            mean, log_std, _ = self.actor.get_action_dist_params(obs)
            q = self.critic(obs, torch.tanh(mean))[0]
            return {"mean": mean, "log_std": log_std, "q": q}

    return SACTrainingPolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch_)


def sac_inference_policy(obs_dim: int, action_low: list[float], action_high: list[float],
                         net_arch: NetArch | None = None) -> torch.nn.Module:
    """The actor of the same policy (critics removed); forward returns ``(mean, log_std)``."""
    policy_cls, obs_space, act_space, arch_ = _sac_build(obs_dim, action_low, action_high,
                                                         net_arch)

    class SACInferencePolicy(policy_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.critic = self.critic_target = None  # type: ignore[has-type]  # critics removed
            self.optimizer = None

        def forward(self, obs: torch.Tensor  # type: ignore[override]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
            mean, log_std, _ = self.actor.get_action_dist_params(obs)
            return mean, log_std

    return SACInferencePolicy(obs_space, act_space, lambda _: 0.0, net_arch=arch_)


def save_vecnormalize_stats(vec_normalize: VecNormalize, path: str | Path,
                            key: str | None = None) -> Path:
    """Write a ``VecNormalize``'s observation statistics (mean, var, count, epsilon, clip) to
    JSON, the ``policy.preprocessing.stats`` file of the adapter's normalisers; ``key``: one
    key's statistics of a ``Dict`` observation space (``norm_obs_keys``), the
    ``policy.inputs[i].preprocessing.stats`` of that input."""
    all_rms = vec_normalize.obs_rms
    rms = all_rms[key] if isinstance(all_rms, dict) and key is not None else all_rms
    if isinstance(rms, dict):
        raise ValueError(f"a Dict observation space: name one of its keys {sorted(rms)}")
    stats: VecNormalizeStats = {
        "mean": np.asarray(rms.mean, np.float64).tolist(),
        "var": np.asarray(rms.var, np.float64).tolist(),
        "count": float(rms.count),
        "epsilon": float(vec_normalize.epsilon),
        "clip_obs": float(vec_normalize.clip_obs),
        "norm_obs": bool(vec_normalize.norm_obs),
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return out


def _stats(stats_path: str | Path) -> VecNormalizeStats:
    from paritygate.reading_text import read_json

    data: VecNormalizeStats = read_json(stats_path, None, what="normalisation stats")
    return data


def normalize_training(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """The trainer's normalisation: SB3's own ``VecNormalize.normalize_obs`` on the saved
    statistics (float64 arithmetic, float32 result; NaN propagates)."""
    try:
        from stable_baselines3.common.running_mean_std import RunningMeanStd
        from stable_baselines3.common.vec_env import VecNormalize
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    s = _stats(stats_path)
    rms = RunningMeanStd(shape=(len(s["mean"]),))
    rms.mean, rms.var, rms.count = np.asarray(s["mean"]), np.asarray(s["var"]), s["count"]
    env = SimpleNamespace(norm_obs=s["norm_obs"], obs_rms=rms, epsilon=s["epsilon"],
                          clip_obs=s["clip_obs"])
    env._normalize_obs = lambda obs, stats: VecNormalize._normalize_obs(env, obs, stats)  # type: ignore[arg-type]
    return np.asarray(VecNormalize.normalize_obs(env, np.asarray(raw)))  # type: ignore[arg-type]


def normalize_serving(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """A serving-side normaliser: the same formula in float32 numpy (NaN propagates)."""
    s = _stats(stats_path)
    x = np.asarray(raw, dtype=np.float32)
    if not s["norm_obs"]:
        return x
    mean = np.asarray(s["mean"], np.float32)
    std = np.sqrt(np.asarray(s["var"], np.float32) + np.float32(s["epsilon"]))
    clip = np.float32(s["clip_obs"])
    return np.clip((x - mean) / std, -clip, clip).astype(np.float32)


from paritygate.adapters.sb3_cnn import cnn_inference_policy, cnn_training_policy  # noqa: E402
from paritygate.adapters.sb3_gaussian import (  # noqa: E402
    gaussian_inference_policy,
    gaussian_training_policy,
)
from paritygate.adapters.sb3_offpolicy import (  # noqa: E402
    dqn_inference_policy,
    dqn_training_policy,
    td3_inference_policy,
    td3_training_policy,
)

__all__ = [
    "a2c_inference_policy", "a2c_training_policy", "cnn_inference_policy", "cnn_training_policy",
    "dqn_inference_policy", "dqn_training_policy", "gaussian_inference_policy",
    "gaussian_training_policy", "inference_policy", "multi_input_inference_policy",
    "multi_input_training_policy", "normalize_serving", "normalize_training",
    "recurrent_inference_policy", "recurrent_training_policy", "sac_inference_policy",
    "sac_training_policy", "save_vecnormalize_stats", "td3_inference_policy",
    "td3_training_policy", "training_policy",
]
