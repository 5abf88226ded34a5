"""What ``paritygate init`` reads from a Stable-Baselines3 zip: which policy it holds (PPO or
A2C actor-critic, SAC, DQN, TD3/DDPG, ``CnnPolicy``) and its factories' arguments.

The layout comes from the tensor names and shapes of ``policy.pth``; the spaces (an image's
shape, the action box) from the readable text of the zip's ``data`` JSON (``_shape``, ``low``,
``high``): the pickled spaces are never loaded. Target networks are training-only heads; DQN's
online ``q_net`` is the policy; SB3's features extractor stored under three names is one tensor
set (the gate judges it by identity), so only the value network is a head.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from torch import Tensor


class ZipSpace(TypedDict, total=False):
    """A space as an SB3 zip's data JSON states it in readable text."""

    type: str
    shape: list[int]
    dtype: str
    low: list[float]
    high: list[float]
    n: int


class SB3Layout(TypedDict):
    """An SB3 MLP ``ActorCriticPolicy`` zip's factory kwargs and what else init reads."""

    obs_dim: int
    n_actions: int
    net_arch: list[int] | dict[str, list[int]]
    continuous: bool
    algorithm: str | None


class SacLayout(TypedDict):
    obs_dim: int
    act_dim: int
    net_arch: list[int]


class DQNLayout(TypedDict):
    obs_dim: int
    n_actions: int
    net_arch: list[int]


class TD3Layout(TypedDict):
    obs_dim: int
    act_dim: int
    net_arch: list[int]
    n_critics: int


class CnnLayout(TypedDict):
    obs_shape: list[int] | None
    n_actions: int
    features_dim: int
    net_arch: list[int]
    shared: bool
    dtype: str | None


def zip_space(checkpoint: Path, key: str) -> ZipSpace | None:
    """An SB3 zip's ``observation_space`` / ``action_space`` as its data JSON states it in
    readable text: ``{"shape", "dtype", "low", "high", "n"}`` (what it gives); ``None`` when
    unreadable."""
    try:
        with zipfile.ZipFile(checkpoint) as zf:
            data = json.loads(zf.read("data"))
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return None
    space = data.get(key) if isinstance(data, dict) else None
    if not isinstance(space, dict):
        return None
    out: ZipSpace = {"type": str(space.get(":type:", ""))}
    shape = space.get("_shape")
    if isinstance(shape, str):
        try:
            shape = json.loads(shape)
        except ValueError:
            shape = None
    if isinstance(shape, list) and all(isinstance(d, int) for d in shape):
        out["shape"] = shape
    if isinstance(space.get("dtype"), str):
        out["dtype"] = space["dtype"]
    for bound in ("low", "high"):
        values = _numbers(space.get(bound))
        if values is not None:
            out[bound] = values
    if str(space.get("n", "")).isdigit():
        out["n"] = int(space["n"])
    return out


def zip_algorithm(checkpoint: Path) -> str | None:
    """``"A2C"`` or ``"PPO"`` for an SB3 actor-critic zip, told by the readable text of its
    data JSON (A2C's RMSprop optimizer, PPO's ``clip_range``); ``None`` when it does not say."""
    try:
        with zipfile.ZipFile(checkpoint) as zf:
            data = json.loads(zf.read("data"))
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return None
    if not isinstance(data, dict):
        return None
    if "clip_range" in data:
        return "PPO"
    kwargs = data.get("policy_kwargs")
    optimizer = kwargs.get("optimizer_class") if isinstance(kwargs, dict) else None
    if isinstance(optimizer, str) and "RMSprop" in optimizer and "n_steps" in data:
        return "A2C"
    return None


def _numbers(text: object) -> list[float] | None:
    """A 1-D numpy repr (``'[-2. -1.5]'``) as floats; ``None`` for anything else (an elided
    or nested array)."""
    if not isinstance(text, str) or "..." in text or text.count("[") != 1:
        return None
    try:
        return [float(v) for v in text.strip().strip("[]").split()]
    except ValueError:
        return None


def _layers(keys: dict[str, Tensor], pattern: str) -> list[tuple[int, str]]:
    return sorted((int(m.group(1)), k) for k in keys if (m := re.fullmatch(pattern, k)))


def ac_layout(checkpoint: Path, keys: dict[str, Tensor]) -> SB3Layout | None:
    """factory_kwargs for the SB3 adapter when the zip holds an MLP ActorCriticPolicy."""
    if checkpoint.suffix.lower() != ".zip" or "action_net.weight" not in keys:
        return None
    layers = sorted(
        (int(m.group(1)), k)
        for k in keys
        if (m := re.fullmatch(r"mlp_extractor\.policy_net\.(\d+)\.weight", k))
    )
    if not layers:
        return None
    first = keys[layers[0][1]]
    pi = [int(keys[k].shape[0]) for _, k in layers]
    vf_layers = sorted((int(m.group(1)), k) for k in keys
                       if (m := re.fullmatch(r"mlp_extractor\.value_net\.(\d+)\.weight", k)))
    vf = [int(keys[k].shape[0]) for _, k in vf_layers]
    return {
        "obs_dim": int(first.shape[1]),
        "n_actions": int(keys["action_net.weight"].shape[0]),
        "net_arch": pi if vf == pi else {"pi": pi, "vf": vf},
        "continuous": "log_std" in keys,
        "algorithm": zip_algorithm(checkpoint),
    }


def sac_layout(checkpoint: Path, keys: dict[str, Tensor]) -> SacLayout | None:
    """factory_kwargs for the SB3 SAC adapter when the zip holds an MLP ``SACPolicy``."""
    if checkpoint.suffix.lower() != ".zip" or "actor.mu.weight" not in keys:
        return None
    layers = sorted(
        (int(m.group(1)), k)
        for k in keys
        if (m := re.fullmatch(r"actor\.latent_pi\.(\d+)\.weight", k))
    )
    first = keys[layers[0][1]] if layers else keys["actor.mu.weight"]
    return {"obs_dim": int(first.shape[1]), "act_dim": int(keys["actor.mu.weight"].shape[0]),
            "net_arch": [int(keys[k].shape[0]) for _, k in layers]}


def image_keys(state: dict[str, Tensor]) -> dict[str, object]:
    """A ``MultiInputPolicy``'s image keys (a NatureCNN in its ``CombinedExtractor``) and
    their ``cnn_output_dim``, read from tensor names and shapes; none: ``{}``."""
    found = {m.group(1): int(t.shape[0]) for k, t in state.items()
             if (m := re.fullmatch(r"features_extractor\.extractors\.([^.]+)\.linear\.0\.weight",
                                   k))}
    if not found:
        return {}
    return {"image_keys": sorted(found), "cnn_output_dim": max(found.values())}


def dqn_layout(checkpoint: Path, keys: dict[str, Tensor]) -> DQNLayout | None:
    """factory_kwargs of the DQN adapter for an MLP ``DQNPolicy`` zip (``q_net.q_net.*``)."""
    if checkpoint.suffix.lower() != ".zip":
        return None
    layers = _layers(keys, r"q_net\.q_net\.(\d+)\.weight")
    if not layers or not any(k.startswith("q_net_target.") for k in keys):
        return None
    return {"obs_dim": int(keys[layers[0][1]].shape[1]),
            "n_actions": int(keys[layers[-1][1]].shape[0]),
            "net_arch": [int(keys[k].shape[0]) for _, k in layers[:-1]]}


def td3_layout(checkpoint: Path, keys: dict[str, Tensor]) -> TD3Layout | None:
    """factory_kwargs of the TD3 adapter for an MLP ``TD3Policy`` zip (TD3, DDPG: ``actor.mu``
    with an ``actor_target``; a SAC actor has ``actor.latent_pi`` instead)."""
    if checkpoint.suffix.lower() != ".zip" or not any(k.startswith("actor_target.") for k in keys):
        return None
    layers = _layers(keys, r"actor\.mu\.(\d+)\.weight")
    if not layers:
        return None
    critics = {m.group(1) for k in keys if (m := re.match(r"critic\.(qf\d+)\.", k))}
    return {"obs_dim": int(keys[layers[0][1]].shape[1]),
            "act_dim": int(keys[layers[-1][1]].shape[0]),
            "net_arch": [int(keys[k].shape[0]) for _, k in layers[:-1]],
            "n_critics": max(1, len(critics))}


def cnn_layout(checkpoint: Path, keys: dict[str, Tensor]) -> CnnLayout | None:
    """factory_kwargs of the CnnPolicy adapter for a NatureCNN ``ActorCriticCnnPolicy`` zip."""
    if (checkpoint.suffix.lower() != ".zip" or "action_net.weight" not in keys
            or "features_extractor.linear.0.weight" not in keys):
        return None
    layers = _layers(keys, r"mlp_extractor\.policy_net\.(\d+)\.weight")
    space = zip_space(checkpoint, "observation_space") or {}
    return {"obs_shape": space.get("shape"),
            "n_actions": int(keys["action_net.weight"].shape[0]),
            "features_dim": int(keys["features_extractor.linear.0.weight"].shape[0]),
            "net_arch": [int(keys[k].shape[0]) for _, k in layers],
            "shared": not any(k.startswith("vf_features_extractor.") for k in keys) or all(
                _same(keys[k], keys.get("features_extractor." + k.split(".", 1)[1]))
                for k in keys if k.startswith("vf_features_extractor.")),
            "dtype": space.get("dtype")}


def _same(tensor: Tensor, other: Tensor | None) -> bool:
    import torch

    return other is not None and tensor.shape == other.shape and bool(torch.equal(tensor, other))


class ActionBox(TypedDict):
    """An SB3 zip's action box as its data JSON states it (``None`` where it does not)."""

    low: list[float] | None
    high: list[float] | None
    where: str


def action_box(source: Path, act_dim: int) -> ActionBox:
    """The action box of an SB3 zip with ``act_dim`` action dimensions, from the zip's action
    space, with where it came from; ``None`` bounds when the zip does not say."""
    box = zip_space(source, "action_space") or {}
    low, high = box.get("low"), box.get("high")
    if isinstance(low, list) and isinstance(high, list) and len(low) == len(high) == act_dim:
        return {"low": low, "high": high, "where": f"from the zip's action space [{low}, {high}]"}
    return {"low": None, "high": None, "where": ""}
