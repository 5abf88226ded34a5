"""``paritygate init``: a commented gate config written from what a checkpoint reveals.

It reads only metadata and tensors (safetensors headers, ``weights_only`` torch
files, an SB3 zip's ``policy.pth``, ONNX graph inputs and outputs, an HF
directory's JSON files), never code. What it can infer is filled in with a
comment saying where it came from (training-only heads from tensor names, input
and output names from the artifact); what it cannot is a ``TODO:`` value, and
:func:`paritygate.config.load_config` refuses a config that still holds one
(exit 2, naming the key), so a half-edited config never runs. The gate is named after the
policy, never the training step (:func:`paritygate.init_infer.gate_name`); an HF directory
gets the family its architecture fits (:mod:`paritygate.init_hf`).
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.init_infer import (
    TODO,
    config_header,
    find_todos,
    gate_name,
    gitignore_proposal,
    head_prefixes,
    python_path,
)
from paritygate.init_infer import relative as _rel
from paritygate.init_infer import yaml_scalar as _q
from paritygate.init_inputs import InputLayout, inputs_lines, layout, sb3_dict_spaces
from paritygate.init_sb3 import flow as _flow
from paritygate.init_sb3 import zip_algorithm

__all__ = ["TODO", "WrittenConfig", "find_todos", "head_prefixes", "write_config"]



@dataclass
class WrittenConfig:
    """The config ``paritygate init`` wrote, the dotted keys still marked TODO, and notes:
    what it chose and why (the name, the family) and the ``.gitignore`` entries to add."""

    path: Path
    todos: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gitignore: tuple[Path, list[str]] | None = None
    """The ``.gitignore`` file and the entries it lacks (none missing: an empty list)."""


def _onnx_io(path: Path) -> tuple[list[tuple[str, list[Any]]], list[str]]:
    """Graph inputs (name, shape) without initializers, and output names."""
    try:
        import onnx
    except ImportError:
        return [], []
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise InputError(path, None, f"unreadable ONNX file: {exc}") from None
    init_names = {t.name for t in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in init_names:
            continue
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        inputs.append((value.name, dims))
    return inputs, [o.name for o in model.graph.output]


def _find_artifact(checkpoint: Path, artifact: Path | None) -> Path | None:
    if artifact is not None:
        if not artifact.is_file():
            raise InputError(artifact, None, "ONNX artifact not found")
        return artifact
    beside = sorted(checkpoint.parent.glob("*.onnx"))
    return beside[0] if len(beside) == 1 else None


def _sb3_layout(checkpoint: Path, keys: dict[str, Any]) -> dict[str, Any] | None:
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


def _sac_layout(checkpoint: Path, keys: dict[str, Any]) -> dict[str, Any] | None:
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


def _sac_text(source: Path, out: Path, name: str, name_note: str, sac: dict[str, Any],
              n_keys: int) -> str:
    """The config of an SB3 SAC zip: the adapter's SAC factories and its Gaussian; the action
    box (not in the tensors) is TODO."""
    base = out.parent
    box = _q(f"{TODO}: the action space's {{}} bound, one value per dimension "
             f"({sac['act_dim']})")
    lines = config_header(source, out, name, name_note, "policy")
    lines += [
        "policy:",
        "  # Stable-Baselines3 SACPolicy (read through policy.pth, weights_only): obs_dim and",
        f"  # net_arch read from the tensor shapes of {source.name}.",
        "  training_factory: paritygate.adapters.sb3:sac_training_policy    # forward -> "
        "{mean, log_std, q}",
        "  inference_factory: paritygate.adapters.sb3:sac_inference_policy  # actor only -> "
        "(mean, log_std)",
        "  factory_kwargs:",
        f"    obs_dim: {sac['obs_dim']}",
        f"    net_arch: {json.dumps(sac['net_arch'])}",
        f"    action_low: {box.format('low')}",
        f"    action_high: {box.format('high')}",
        f"  checkpoint: {_rel(source, base)}   # {n_keys} tensors",
        '  training_heads: ["critic", "critic_target"]   # the Q-networks: training only',
        "  policy_output: mean",
        '  output_names: ["mean", "log_std"]',
        "  action_space: continuous",
        "  distribution:              # SB3 acts low + (tanh(mean) + 1) / 2 * (high - low)",
        "    log_std: output",
        "    log_std_key: log_std",
        "    log_std_clamp: [-20, 2]   # SB3's LOG_STD_MIN, LOG_STD_MAX",
        "    squash: tanh",
        f"    action_scale: {_q(f'{TODO}: (high - low) / 2 of the action space')}",
        f"    action_bias: {_q(f'{TODO}: (high + low) / 2 of the action space')}",
        "  probes:",
        "    generator: "
        + _q(f"{TODO}: module:callable(count, seed) -> raw observations (N, ...); "
             "or replace this line with file: probes.npy"),
        "golden:",
        f"  dir: {_rel(Path.cwd() / 'golden', base)}   # baselines in <dir>/{name}/<check_id>.json",
        "",
    ]
    return "\n".join(lines)


def bare_log_std(keys: list[str]) -> list[str]:
    """Top-level log-std tensors (``log_std``, CleanRL's ``actor_logstd``): a Gaussian's
    state-independent parameter, which a served actor returning the mean leaves out."""
    return [k for k in keys if "." not in k and k.lower().replace("_", "").endswith("logstd")]


def _load_state(source: Path) -> tuple[dict[str, Any], str | None, list[str]]:
    """The checkpoint's state dict, its key, and the candidate keys when a training
    checkpoint holds one only under an uncommon nested key (``agent.actor``): the largest
    candidate is read, and more than one leaves the key TODO."""
    from paritygate.checkpoints import (
        STATE_DICT_KEY,
        load_checkpoint_state,
        nested_state_dict_keys,
    )

    try:
        state, key = load_checkpoint_state(source)
        return state, key, []
    except InputError as exc:
        if exc.key != STATE_DICT_KEY:
            raise
        candidates = nested_state_dict_keys(source)
        if not candidates:
            raise
    state, key = load_checkpoint_state(source, state_dict_key=candidates[0])
    return state, key, candidates


def _buffer_value(state: dict[str, Any], name: str) -> Any:
    """An ``action_scale`` / ``action_bias`` buffer's value (one number when all equal)."""
    found = [k for k in state if k == name or k.endswith("." + name)]
    if len(found) != 1:
        return None
    values = [float(v) for v in state[found[0]].detach().float().reshape(-1).tolist()]
    return values[0] if len(set(values)) == 1 else values


def _log_std_layers(keys: list[str]) -> list[str]:
    """Modules that compute a log-std from the trunk (CleanRL SAC's ``fc_logstd``)."""
    modules = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    return sorted(m for m in modules
                  if m.rsplit(".", 1)[-1].lower().replace("_", "").endswith("logstd"))


_ACTOR_TARGET = re.compile(r"(actor_target|target_actor)", re.I)
_Q_NAMES = re.compile(r"(qf\d*|q\d+|q_?net\w*|critic\d*)(_target)?", re.I)


def deterministic_actor(keys: list[str]) -> bool:
    """A TD3/DDPG-style actor: no log-std, and an actor target network, or an actor beside
    Q-networks (``qf1``, ``q1``; a PPO ``critic`` alone is a value network)."""
    top = {k.split(".")[0] for k in keys if "." in k}
    if any("logstd" in k.lower().replace("_", "") for k in keys):
        return False
    if any(_ACTOR_TARGET.fullmatch(t) for t in top):
        return True
    return "actor" in top and any(_Q_NAMES.fullmatch(t) and not t.lower().startswith("critic")
                                  for t in top)


def _distribution_lines(state: dict[str, Any], log_stds: list[str], layers: list[str]
                        ) -> list[str]:
    """The ``distribution`` block: the log-std's source (none for a deterministic actor), and
    the squash, scale and bias (TODO unless ``action_scale`` / ``action_bias`` buffers give
    them)."""
    lines = ["  distribution:            # the Gaussian (README: continuous actions); review"]
    if not log_stds and not layers:
        lines = ["  distribution:            # a deterministic actor (TD3/DDPG: an actor target "
                 "or Q-networks, no log-std); review",
                 "    type: deterministic"]
    elif log_stds:
        lines += [f"    log_std: parameter     # {log_stds[0]!r} is a bare tensor of the "
                  "checkpoint (a training head: the served actor returns the mean)",
                  f"    log_std_key: {_q(log_stds[0])}"]
    else:
        lines += [f"    log_std: output        # {layers[0]!r} computes it in the forward",
                  "    log_std_key: " + _q(f"{TODO}: dict key or tuple index of the log-std "
                                           "in the training forward's result"),
                  "    log_std_clamp: " + _q(f"{TODO}: [min, max] the training side clamps "
                                             "the raw log-std to, or null")]
    lines.append("    squash: " + _q(f"{TODO}: tanh (SAC, TD3) | clip (clipped to the action "
                                     "box) | none"))
    for name, what in (("action_scale", "(high - low) / 2"), ("action_bias", "(high + low) / 2")):
        value = _buffer_value(state, name)
        if value is None:
            lines.append(f"    {name}: " + _q(f"{TODO}: {what} of the action box"))
        else:
            lines.append(f"    {name}: {_q(value)}   # from the checkpoint's {name} buffer")
    if not log_stds:
        lines.append("    serving_output: " + _q(f"{TODO}: mean (the artifact serves the "
                                                  "policy output u) | action (the env action)"))
    return lines


def _policy_text(
    source: Path, out: Path, name: str, artifact: Path | None, name_note: str = ""
) -> str:
    state, state_key, key_candidates = _load_state(source)
    sac = _sac_layout(source, state)
    if sac is not None:
        return _sac_text(source, out, name, name_note, sac, len(state))
    from paritygate.init_sb3 import sb3_text

    text = sb3_text(source, out, name, name_note, state)
    if text is not None:
        return text
    keys = list(state)
    heads = head_prefixes(keys)
    sb3 = _sb3_layout(source, state)
    spaces = sb3_dict_spaces(source) if sb3 is not None else None
    base = out.parent
    n_params = sum(int(t.numel()) for t in state.values())
    lines = config_header(source, out, name, name_note, "policy")
    if sb3 is None:
        folders, why = python_path(Path.cwd())
        lines.append(
            f"python_path: [{', '.join(_q(_rel(f, base)) for f in folders)}]   # folders "
            f"(relative to this file) the module:callable names below import from: {why}"
        )
    lines.append("policy:")
    if sb3 is not None and spaces is not None:
        kwargs = {"spaces": {k: v if v is not None else f"{TODO}: this key's shape"
                             for k, v in spaces.items()},
                  "n_actions": sb3["n_actions"], "net_arch": sb3["net_arch"]}
        lines += [
            "  # Stable-Baselines3 MultiInputPolicy (read through policy.pth, weights_only): the",
            "  # Dict space's keys and shapes from the zip's data JSON (its readable text; the",
            f"  # pickled space is never loaded), n_actions and net_arch from {source.name}.",
            "  training_factory: paritygate.adapters.sb3:multi_input_training_policy    "
            "# -> {logits, value}",
            "  inference_factory: paritygate.adapters.sb3:multi_input_inference_policy  "
            "# actor path only",
            "  factory_kwargs: {"
            + ", ".join(f"{k}: {json.dumps(v)}" for k, v in kwargs.items())
            + "}",
        ]
    elif sb3 is not None:
        kwargs = {k: sb3[k] for k in ("obs_dim", "n_actions", "net_arch")}
        a2c = "a2c_" if sb3["algorithm"] == "A2C" else ""
        lines += [
            "  # Stable-Baselines3 ActorCriticPolicy (read through policy.pth, weights_only):",
            f"  # obs_dim, n_actions and net_arch read from the tensor shapes of {source.name}.",
        ]
        if a2c:
            lines.append("  # A2C: the zip's data names RMSprop and no PPO clip_range")
        lines += [
            f"  training_factory: paritygate.adapters.sb3:{a2c}training_policy    # forward -> "
            "{logits, value}",
            f"  inference_factory: paritygate.adapters.sb3:{a2c}inference_policy  # actor path "
            "only",
            "  factory_kwargs: {"
            + ", ".join(f"{k}: {_flow(v)}" for k, v in kwargs.items())
            + "}",
        ]
        if sb3["continuous"]:
            lines.append(f"  # {TODO}: log_std found: a continuous action space; the SB3 adapter "
                         "serves Discrete actions only")
    else:
        lines += [
            "  # module:callable(**factory_kwargs) -> nn.Module; importable where the gate runs.",
            f"  training_factory: {_q(f'{TODO}: module:callable building the training model, with heads')}",  # noqa: E501
            f"  inference_factory: {_q(f'{TODO}: module:callable building the serving model, heads removed')}",  # noqa: E501
            "  factory_kwargs: {}   # keyword arguments passed to both factories",
            "  # factory_path_kwargs: [name]   # factory_kwargs holding paths, resolved relative "
            "to this file",
        ]
    lines += [
        f"  checkpoint: {_rel(source, base)}   # {len(keys)} tensors, {n_params:,} values",
    ]
    if len(key_candidates) > 1:
        lines.append("  state_dict_key: " + _q(f"{TODO}: the key of the policy's state dict, "
                                               f"one of {', '.join(key_candidates)}")
                     + f"   # proposed below from {state_key}")
    elif key_candidates:
        lines.append(f"  state_dict_key: {_q(state_key)}   # a training checkpoint: the only "
                     "mapping of tensors found under its keys")
    elif state_key is not None:
        lines.append(f"  state_dict_key: {_q(state_key)}   # a training checkpoint: its state "
                     "dict sits under this key (found by name; dotted when nested)")
    if any(k.startswith("module.") for k in keys):
        lines.append("  # note: keys carry DDP's 'module.' prefix; weights_load will name it")
    if any(k.startswith("_orig_mod.") for k in keys):
        lines.append("  # note: keys carry torch.compile's '_orig_mod.' prefix; weights_load "
                     "will name it")
    if sb3 is not None:
        heads = [h for h in ("mlp_extractor.value_net", "value_net") if any(
            k.startswith(h + ".") for k in keys)]
    log_stds = [] if sb3 is not None else bare_log_std(keys)
    heads += [k for k in log_stds if k not in heads]
    head_note = "proposed from tensor names; review" if heads else "none found in tensor names"
    lines.append(f"  training_heads: {_q(heads)}   # training-only module prefixes: {head_note}")
    onnx_inputs: list[tuple[str, list[Any]]] = []
    onnx_outputs: list[str] = []
    artifact_name = artifact.name if artifact is not None else ""
    if artifact is not None:
        onnx_inputs, onnx_outputs = _onnx_io(artifact)
        lines.append(f"  artifact: {_rel(artifact, base)}")
        manifest = artifact.parent / "manifest.json"
        lines.append(
            "  # manifest.json beside the artifact found: export_integrity checks its sha256"
            if manifest.exists()
            else "  # no manifest.json beside the artifact: provenance is proven numerically"
        )
    else:
        shipped = _rel(Path.cwd() / "export" / name / "policy.onnx", base)
        lines.append(f"  # artifact: {shipped}   # omitted: exported on the fly on every run; "
                     f"`paritygate export {out.as_posix()}` writes this one + manifest.json")
    if sb3 is not None:
        lines.append("  policy_output: logits      # the adapter's training forward returns a dict")
    else:
        lines.append("  policy_output: "
                     + _q(f"{TODO}: dict key (e.g. logits) or tuple index (e.g. 0) of the policy "
                          "output in the training forward's result")
                     )
    found: InputLayout | None = None
    if len(onnx_inputs) > 1:
        found = layout(onnx_inputs, onnx_outputs)
        lines += inputs_lines(found, f"the artifact's inputs and shapes ({artifact_name})",
                              "dict" if spaces is not None else None)
    elif spaces is not None:
        found = InputLayout(observations=list(spaces.items()), order=list(spaces))
        lines += inputs_lines(found, "the zip's Dict observation space", "dict")
    elif onnx_inputs:
        name_in, dims = onnx_inputs[0]
        lines.append(f"  input_name: {_q(name_in)}   # from the artifact; shape {dims}")
    else:
        lines.append('  input_name: "obs"   # the artifact input name (default)')
    if onnx_outputs:
        lines.append(f"  output_names: {_q(onnx_outputs)}   # from the artifact; first = policy")
    else:
        lines.append('  output_names: ["logits"]   # outputs the artifact must declare')
    if sb3 is not None:
        action = "continuous" if sb3["continuous"] else "discrete"
        lines.append(f"  action_space: {action}   # from the policy's tensors")
    else:
        layers = _log_std_layers(keys)
        deterministic = deterministic_actor(keys)
        guess = "continuous" if log_stds or layers or deterministic or any(
            k.lower().replace("_", "").endswith("logstd") for k in keys) else "discrete"
        lines.append(f"  action_space: {guess}   # discrete | continuous; guessed from tensor "
                     "names: review")
        if log_stds or layers or deterministic:
            lines += _distribution_lines(state, log_stds, layers)
    if found is None:
        lines += [
            "  # preprocessing:          # both sides' observation preprocessing, if any",
            "  #   training: mypkg.obs:normalize_torch   # fn(raw, stats_path=..., **kwargs)",
            "  #   serving: myserving.obs:normalize_numpy",
            "  #   stats: obs_norm.json",
            "  #   discrete_features: []",
        ]
    lines += [
        "  probes:                   # raw observations the checks feed",
        "    generator: "
        + _q(f"{TODO}: module:callable(count, seed) -> raw observations (N, ...); "
             "or replace this line with file: probes.npy"),
        "    count: 64",
        "    seed: 0",
        "golden:",
        f"  dir: {_rel(Path.cwd() / 'golden', base)}   # baselines in <dir>/{name}/<check_id>.json",
        "",
    ]
    return "\n".join(lines)


def write_config(
    source: Path,
    *,
    out: Path | None = None,
    artifact: Path | None = None,
    name: str | None = None,
    serving: Path | None = None,
    checkpoint: int | str | None = None,
    reward_model: Path | None = None,
    reference: Path | None = None,
) -> WrittenConfig:
    """Inspect ``source`` (a checkpoint file, an HF model directory or a trainer output_dir)
    and write a config. With an output_dir, ``checkpoint`` picks the ``checkpoint-N`` to
    inspect (default: the latest); the config names the output_dir. ``serving`` is the served
    copy of an HF causal LM (``causal_lm.serving.model_dir``).

    For a causal LM, ``reward_model`` and ``reference`` (or directories found beside it) fill
    the ``reward`` and ``reference`` blocks. Never overwrites: an existing ``out`` is an
    :class:`InputError`.
    """
    from paritygate.reading import check_input

    source = Path(source)
    if not source.exists():
        raise InputError(source, None, "checkpoint or model directory not found")
    check_input(source, None, what="checkpoint or model directory",
                expect="dir" if source.is_dir() else "file")
    gate, why = gate_name(source, name, Path(out) if out is not None else None)
    name_note = f"from {why}; names golden/{gate}/: edit to rename"
    target = Path(out) if out is not None else Path("configs") / f"{gate}.yaml"
    if target.exists():
        raise InputError(target, None, "already exists; refusing to overwrite (choose --out)")
    notes = [f"name {gate!r} ({name_note})"]
    if serving is not None and not Path(serving).is_dir():
        raise InputError(Path(serving), None,
                         "--serving takes the served HF model directory of a causal LM")
    if source.is_dir():
        from paritygate.init_hf import hf_dir_text
        from paritygate.trainer_output import is_output_dir, pin_output_dir, resolve_checkpoint

        record = None
        if is_output_dir(source) or checkpoint is not None:
            record = resolve_checkpoint(
                source, checkpoint, key="--checkpoint" if checkpoint is not None else None)
        inspected = record.path if record is not None else source
        text, family = hf_dir_text(inspected, target, gate, name_note,
                                   Path(serving) if serving is not None else None)
        notes.append(f"family {family}")
        if family.startswith("causal_lm"):
            from paritygate.init_rl import rl_loop_lines

            rl_lines, rl_notes = rl_loop_lines(inspected, target.parent, reward_model, reference)
            if rl_lines:
                head, sep, tail = text.partition("\ngolden:")
                text = head + "\n" + "\n".join(rl_lines) + sep + tail
            notes += rl_notes
        if record is not None and record.output_dir is not None:
            text = pin_output_dir(text, record, target, checkpoint)
            notes.append(f"trainer output_dir: inspected {record.describe()}; run gates "
                         + (f"checkpoint-{checkpoint}" if isinstance(checkpoint, int)
                            else "the latest checkpoint-N")
                         + " (paritygate run --checkpoint N for another, --all for each)")
    else:
        if source.suffix.lower() == ".zip" and not zipfile.is_zipfile(source):
            raise InputError(source, None, "not a zip file")
        found = _find_artifact(source, artifact)
        if found is not None:
            check_input(found, "--artifact", what="artifact")
        text = _policy_text(source, target, gate, found, name_note)
    import yaml

    todos = find_todos(yaml.safe_load(text))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    ignore = gitignore_proposal(Path.cwd())
    if ignore[1]:
        notes.append(f"add to {_rel(ignore[0], Path.cwd())}: {', '.join(ignore[1])} (a failing "
                     "run writes "
                     "*.obtained.json beside the baselines; reports are rebuilt each run)")
    return WrittenConfig(target, todos, notes, ignore)
