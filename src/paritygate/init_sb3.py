"""What ``paritygate init`` writes for a Stable-Baselines3 DQN, TD3/DDPG or ``CnnPolicy`` zip.

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
from typing import Any

from paritygate.init_infer import TODO, config_header
from paritygate.init_infer import relative as _rel
from paritygate.init_infer import yaml_scalar as _q


def zip_space(checkpoint: Path, key: str) -> dict[str, Any] | None:
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
    out: dict[str, Any] = {"type": str(space.get(":type:", ""))}
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


def flow(value: object) -> str:
    """A YAML flow value: JSON for lists and scalars, ``{k: v}`` for a mapping (``net_arch:
    {pi: [64], vf: [32]}``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def _numbers(text: Any) -> list[float] | None:
    """A 1-D numpy repr (``'[-2. -1.5]'``) as floats; ``None`` for anything else (an elided
    or nested array)."""
    if not isinstance(text, str) or "..." in text or text.count("[") != 1:
        return None
    try:
        return [float(v) for v in text.strip().strip("[]").split()]
    except ValueError:
        return None


def _layers(keys: dict[str, Any], pattern: str) -> list[tuple[int, str]]:
    return sorted((int(m.group(1)), k) for k in keys if (m := re.fullmatch(pattern, k)))


def dqn_layout(checkpoint: Path, keys: dict[str, Any]) -> dict[str, Any] | None:
    """factory_kwargs of the DQN adapter for an MLP ``DQNPolicy`` zip (``q_net.q_net.*``)."""
    if checkpoint.suffix.lower() != ".zip":
        return None
    layers = _layers(keys, r"q_net\.q_net\.(\d+)\.weight")
    if not layers or not any(k.startswith("q_net_target.") for k in keys):
        return None
    return {"obs_dim": int(keys[layers[0][1]].shape[1]),
            "n_actions": int(keys[layers[-1][1]].shape[0]),
            "net_arch": [int(keys[k].shape[0]) for _, k in layers[:-1]]}


def td3_layout(checkpoint: Path, keys: dict[str, Any]) -> dict[str, Any] | None:
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


def cnn_layout(checkpoint: Path, keys: dict[str, Any]) -> dict[str, Any] | None:
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


def _same(tensor: Any, other: Any) -> bool:
    import torch

    return other is not None and tensor.shape == other.shape and bool(torch.equal(tensor, other))


def _tail(name: str, base: Path, probes_what: str) -> list[str]:
    return [
        "  probes:",
        "    generator: " + _q(f"{TODO}: module:callable(count, seed) -> {probes_what}; or "
                                "replace this line with file: probes.npy"),
        "golden:",
        f"  dir: {_rel(Path.cwd() / 'golden', base)}   # baselines in <dir>/{name}/<check_id>.json",
        "",
    ]


def sb3_text(source: Path, out: Path, name: str, name_note: str, state: dict[str, Any]
             ) -> str | None:
    """The config of a DQN, TD3/DDPG or CnnPolicy zip, or ``None`` for another layout."""
    base = out.parent
    head = config_header(source, out, name, name_note, "policy")
    ckpt = f"  checkpoint: {_rel(source, base)}   # {len(state)} tensors"
    dqn = dqn_layout(source, state)
    if dqn is not None:
        kwargs = ", ".join(f"{k}: {json.dumps(v)}" for k, v in dqn.items())
        return "\n".join([*head,
            "policy:",
            "  # Stable-Baselines3 DQNPolicy (read through policy.pth, weights_only): obs_dim,",
            f"  # n_actions and net_arch read from the tensor shapes of {source.name}.",
            "  training_factory: paritygate.adapters.sb3:dqn_training_policy    # -> "
            "{q_values, target_q}",
            "  inference_factory: paritygate.adapters.sb3:dqn_inference_policy  # q_net only",
            f"  factory_kwargs: {{{kwargs}}}",
            ckpt,
            '  training_heads: ["q_net_target"]   # the target network: training only (q_net '
            "is the policy)",
            "  policy_output: q_values   # the greedy action is the argmax of q_net's Q-values",
            '  output_names: ["q_values"]',
            "  action_space: discrete",
            *_tail(name, base, "raw observations (N, obs_dim)"),
        ])
    td3 = td3_layout(source, state)
    if td3 is not None:
        return _td3_text(source, name, base, head, ckpt, td3, state)
    cnn = cnn_layout(source, state)
    if cnn is not None:
        return _cnn_text(source, name, base, head, ckpt, cnn, state)
    return None


def _td3_text(source: Path, name: str, base: Path, head: list[str], ckpt: str,
              td3: dict[str, Any], state: dict[str, Any]) -> str:
    box = zip_space(source, "action_space") or {}
    low, high = box.get("low"), box.get("high")
    known = (isinstance(low, list) and isinstance(high, list)
             and len(low) == len(high) == td3["act_dim"])
    if known:
        assert isinstance(low, list) and isinstance(high, list)
        scale = [(h - lo) / 2 for lo, h in zip(low, high, strict=True)]
        bias = [(h + lo) / 2 for lo, h in zip(low, high, strict=True)]
        where = f"   # from the zip's action space [{low}, {high}]"
        values = {"action_low": json.dumps(low), "action_high": json.dumps(high),
                  "action_scale": json.dumps(scale[0] if len(set(scale)) == 1 else scale)
                  + "   # (high - low) / 2",
                  "action_bias": json.dumps(bias[0] if len(set(bias)) == 1 else bias)
                  + "   # (high + low) / 2"}
    else:
        where = ""
        todo = f"{TODO}: the action space's {{}}, one value per dimension ({td3['act_dim']})"
        values = {"action_low": _q(todo.format("low bound")),
                  "action_high": _q(todo.format("high bound")),
                  "action_scale": _q(f"{TODO}: (high - low) / 2 of the action space"),
                  "action_bias": _q(f"{TODO}: (high + low) / 2 of the action space")}
    kind = "TD3" if td3["n_critics"] > 1 else "DDPG (one critic)"
    return "\n".join([*head,
        "policy:",
        f"  # Stable-Baselines3 TD3Policy, {kind} (read through policy.pth, weights_only):",
        f"  # obs_dim, net_arch and n_critics read from the tensor shapes of {source.name}.",
        "  training_factory: paritygate.adapters.sb3:td3_training_policy    # -> {pre_tanh, q}",
        "  inference_factory: paritygate.adapters.sb3:td3_inference_policy  # actor only -> "
        "pre_tanh",
        "  factory_kwargs:",
        f"    obs_dim: {td3['obs_dim']}",
        f"    net_arch: {json.dumps(td3['net_arch'])}",
        f"    n_critics: {td3['n_critics']}",
        f"    action_low: {values['action_low']}{where}",
        f"    action_high: {values['action_high']}",
        ckpt,
        '  training_heads: ["actor_target", "critic", "critic_target"]   # target networks '
        "and critics: training only",
        "  policy_output: pre_tanh   # the actor's output before its tanh",
        '  output_names: ["pre_tanh"]',
        "  action_space: continuous",
        "  distribution:              # SB3 acts low + (tanh(u) + 1) / 2 * (high - low)",
        "    type: deterministic      # no log-std: only the action transform is judged",
        "    squash: tanh",
        f"    action_scale: {values['action_scale']}",
        f"    action_bias: {values['action_bias']}",
        "    serving_output: mean     # mean: the artifact serves u | action: the env action",
        *_tail(name, base, "raw observations (N, obs_dim)"),
    ])


def _cnn_text(source: Path, name: str, base: Path, head: list[str], ckpt: str,
              cnn: dict[str, Any], state: dict[str, Any]) -> str:
    shape = cnn["obs_shape"]
    shape_text = (json.dumps(shape) + "   # (C, H, W) from the zip's observation space"
                  if shape else _q(f"{TODO}: the image shape [C, H, W] the policy takes"))
    aliases = sorted({k.split(".")[0] for k in state if k.startswith(("pi_features_extractor.",
                                                                         "vf_features_extractor."))})
    lines = [*head,
        "policy:",
        "  # Stable-Baselines3 ActorCriticCnnPolicy (NatureCNN; read through policy.pth,",
        f"  # weights_only): n_actions, features_dim and net_arch from {source.name}.",
        "  training_factory: paritygate.adapters.sb3:cnn_training_policy    # -> {logits, value}",
        "  inference_factory: paritygate.adapters.sb3:cnn_inference_policy  # actor path only",
        "  factory_kwargs:",
        f"    obs_shape: {shape_text}",
        f"    n_actions: {cnn['n_actions']}",
        f"    features_dim: {cnn['features_dim']}",
        f"    net_arch: {json.dumps(cnn['net_arch'])}",
    ]
    if not cnn["shared"]:
        lines.append("    share_features_extractor: false   # the value side has its own "
                     "extractor")
    lines.append(ckpt)
    if aliases and cnn["shared"]:
        lines.append(f"  # {', '.join(aliases)}: the same tensors as features_extractor (one "
                     "module under several names, judged by identity): not heads")
    heads = ["value_net"] + (["vf_features_extractor"] if not cnn["shared"] else [])
    if any(k.startswith("mlp_extractor.value_net.") for k in state):
        heads.insert(0, "mlp_extractor.value_net")
    dtype = cnn.get("dtype") or "uint8"
    lines += [
        f"  training_heads: {json.dumps(heads)}   # the value side: training only",
        "  policy_output: logits",
        '  output_names: ["logits"]',
        "  action_space: discrete",
        f"  # probes: {dtype} images (N, C, H, W) as the environment gives them; the policy "
        "scales pixels by 1/255 itself",
        *_tail(name, base, f"{dtype} images (N, C, H, W)"),
    ]
    return "\n".join(lines)
