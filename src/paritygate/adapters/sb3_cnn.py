"""Stable-Baselines3 ``CnnPolicy`` (PPO/A2C over uint8 images) as paritygate factories.

SB3 registers the shared features extractor under three names (``features_extractor``,
``pi_features_extractor``, ``vf_features_extractor``) and saves it under all three; the gate
loads and judges it by identity (:func:`paritygate.families.policy.loading.find_aliases`), so
only the value network is a training head::

    training_factory: paritygate.adapters.sb3:cnn_training_policy    # -> {logits, value}
    inference_factory: paritygate.adapters.sb3:cnn_inference_policy  # actor path only
    factory_kwargs: {obs_shape: [1, 36, 36], n_actions: 3, features_dim: 32}
    training_heads: [value_net]
    policy_output: logits
    probes: {file: probes.npy}     # uint8 images (N, C, H, W), as the environment gives them

The policy scales pixels by 1/255 itself (``normalize_images``), so the probes and an exported
artifact's input are uint8 unless the artifact was exported with another input dtype.

Where serving scales pixels outside the network, the scaling is declared preprocessing instead:
``normalize_images: false`` in ``factory_kwargs`` (the network takes [0, 1] floats) and SB3's
own ``preprocess_obs`` as the training side, so a serving path without the /255 fails
``preprocessing_parity`` as ``image_scale_missing``::

    factory_kwargs: {obs_shape: [1, 36, 36], n_actions: 3, features_dim: 32,
                     normalize_images: false}
    preprocessing:
      training: paritygate.adapters.sb3_cnn:scale_images_training   # SB3's preprocess_obs
      serving: myserving.pixels:to_float                             # the served path's own
"""

from __future__ import annotations

import numpy as np
import torch

from paritygate.errors import MissingExtra


def _cnn(obs_shape: list[int], n_actions: int, features_dim: int,
         net_arch: list[int] | None, normalize_images: bool,
         share_features_extractor: bool) -> tuple[type, dict[str, object]]:
    try:
        import gymnasium as gym
        from stable_baselines3.common.policies import ActorCriticCnnPolicy
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    kwargs = {"observation_space": gym.spaces.Box(0, 255, shape=tuple(int(d) for d in obs_shape),
                                                  dtype=np.uint8),
              "action_space": gym.spaces.Discrete(n_actions), "lr_schedule": lambda _: 0.0,
              "net_arch": list(net_arch) if net_arch is not None else None,
              "features_extractor_kwargs": {"features_dim": features_dim},
              "normalize_images": normalize_images,
              "share_features_extractor": share_features_extractor}
    return ActorCriticCnnPolicy, kwargs


def cnn_training_policy(obs_shape: list[int], n_actions: int, features_dim: int = 512,
                        net_arch: list[int] | None = None, normalize_images: bool = True,
                        share_features_extractor: bool = True) -> torch.nn.Module:
    """The whole SB3 ``ActorCriticCnnPolicy`` (NatureCNN over ``obs_shape`` (C, H, W) uint8
    images, a Discrete action space); forward returns ``{"logits", "value"}``."""
    cls, kwargs = _cnn(obs_shape, n_actions, features_dim, net_arch, normalize_images,
                       share_features_extractor)

    class CnnTraining(cls):  # type: ignore[misc, valid-type]
        def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            features = self.extract_features(obs)
            if self.share_features_extractor:
                latent_pi, latent_vf = self.mlp_extractor(features)
            else:
                latent_pi = self.mlp_extractor.forward_actor(features[0])
                latent_vf = self.mlp_extractor.forward_critic(features[1])
            return {"logits": self.action_net(latent_pi), "value": self.value_net(latent_vf)}

    return CnnTraining(**kwargs)


def cnn_inference_policy(obs_shape: list[int], n_actions: int, features_dim: int = 512,
                         net_arch: list[int] | None = None, normalize_images: bool = True,
                         share_features_extractor: bool = True) -> torch.nn.Module:
    """The actor path of the same policy (value network and the value side's extractor name
    removed); forward returns the logits."""
    cls, kwargs = _cnn(obs_shape, n_actions, features_dim, net_arch, normalize_images,
                       share_features_extractor)

    class CnnInference(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            del self.value_net
            del self.mlp_extractor.value_net
            del self.vf_features_extractor
            self.optimizer = None

        def forward(self, obs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            from stable_baselines3.common.policies import BaseModel

            features = BaseModel.extract_features(self, obs, self.pi_features_extractor)
            return self.action_net(self.mlp_extractor.forward_actor(features))  # type: ignore[no-any-return]

    return CnnInference(**kwargs)


def scale_images_training(raw: np.ndarray) -> torch.Tensor:
    """The trainer's pixel scaling: SB3's own ``preprocess_obs`` on a uint8 image ``Box``
    (``normalize_images``: float, divided by 255)."""
    try:
        import gymnasium as gym
        from stable_baselines3.common.preprocessing import preprocess_obs
    except ImportError:
        raise MissingExtra("stable-baselines3", "sb3") from None
    pixels = np.asarray(raw)
    space = gym.spaces.Box(0, 255, shape=pixels.shape[1:], dtype=np.uint8)
    scaled = preprocess_obs(torch.as_tensor(pixels), space, normalize_images=True)
    assert isinstance(scaled, torch.Tensor)
    return scaled


def scale_images_serving(raw: np.ndarray) -> np.ndarray:
    """A serving-side pixel scaling: float32 numpy, divided by 255."""
    return np.asarray(raw, dtype=np.float32) / np.float32(255.0)
