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

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from paritygate.errors import InputError
from paritygate.init_infer import (
    TODO,
    find_todos,
    gate_name,
    gitignore_proposal,
    head_prefixes,
    python_path,
)
from paritygate.init_infer import relative as _rel
from paritygate.init_infer import yaml_scalar as _q
from paritygate.init_inputs import InputLayout, inputs_lines, layout, sb3_dict_spaces
from paritygate.init_render import render
from paritygate.init_sb3 import action_box, zip_algorithm

if TYPE_CHECKING:
    from torch import Tensor

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


ARTIFACT_SUFFIXES = (".onnx", ".pt2", ".ts")
"""Artifacts init finds beside a checkpoint on its own, the only one of the first suffix present
(a ``.pt`` there may be a checkpoint: name a TorchScript ``.pt`` with ``--artifact``)."""


def artifact_format(path: Path) -> str:
    """``onnx``, ``torchscript`` or ``torch_export``, told by the file; anything else is an
    :class:`InputError` naming the formats the gate reads."""
    from paritygate.engines.artifact_graph import FORMATS_TEXT, sniff_format

    fmt = sniff_format(path)
    if fmt is None:
        raise InputError(path, "--artifact",
                         f"not an artifact the gate reads: the gate reads {FORMATS_TEXT}")
    return fmt


def _onnx_io(path: Path) -> tuple[list[tuple[str, list[int | str]]], list[str]]:
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
    inputs: list[tuple[str, list[int | str]]] = []
    for value in model.graph.input:
        if value.name in init_names:
            continue
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        inputs.append((value.name, dims))
    return inputs, [o.name for o in model.graph.output]


def _find_artifact(checkpoint: Path, artifact: Path | None) -> Path | None:
    if artifact is not None:
        if not artifact.is_file():
            raise InputError(artifact, None, "artifact not found")
        return artifact
    for suffix in ARTIFACT_SUFFIXES:
        beside = sorted(p for p in checkpoint.parent.glob(f"*{suffix}") if p != checkpoint)
        if beside:
            return beside[0] if len(beside) == 1 else None
    return None


def _sb3_layout(checkpoint: Path, keys: dict[str, Tensor]) -> SB3Layout | None:
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


def _sac_layout(checkpoint: Path, keys: dict[str, Tensor]) -> SacLayout | None:
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


def _sac_text(source: Path, out: Path, name: str, name_note: str, sac: SacLayout,
              n_keys: int) -> str:
    """The config of an SB3 SAC zip: the adapter's SAC factories and its Gaussian; the action
    box (not in the tensors) is TODO."""
    return render("sac.yaml.j2", **_base_context(source, out, name, name_note), **sac,
                  n_keys=n_keys)


def _base_context(source: Path, out: Path, name: str, name_note: str) -> dict[str, object]:
    """What every policy template shows: the header's, the checkpoint line's, the golden's."""
    return {"source": source, "out": out, "name": name, "name_note": name_note,
            "family": "policy", "checkpoint": _rel(source, out.parent),
            "golden_dir": _rel(Path.cwd() / "golden", out.parent)}


def bare_log_std(keys: list[str]) -> list[str]:
    """Top-level log-std tensors (``log_std``, CleanRL's ``actor_logstd``): a Gaussian's
    state-independent parameter, which a served actor returning the mean leaves out."""
    return [k for k in keys if "." not in k and k.lower().replace("_", "").endswith("logstd")]


def _load_state(source: Path) -> tuple[dict[str, Tensor], str | None, list[str]]:
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


def _buffer_value(state: dict[str, Tensor], name: str) -> float | list[float] | None:
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
    sb3 = _sb3_layout(source, state)
    spaces = sb3_dict_spaces(source) if sb3 is not None else None
    context = _base_context(source, out, name, name_note)
    context.update(
        sb3=sb3 is not None, spaces=spaces, a2c="", continuous=False, kwargs={},
        python_path=None, n_keys=len(keys),
        n_values=f"{sum(int(t.numel()) for t in state.values()):,}",
        state_key=state_key, key_candidates=key_candidates,
        ddp=any(k.startswith("module.") for k in keys),
        compiled=any(k.startswith("_orig_mod.") for k in keys))
    if sb3 is None:
        folders, why = python_path(Path.cwd())
        context.update(python_path=[_q(_rel(f, out.parent)) for f in folders],
                       python_path_why=why)
        heads = head_prefixes(keys)
    else:
        context.update(a2c="a2c_" if sb3["algorithm"] == "A2C" else "",
                       continuous=sb3["continuous"],
                       kwargs={k: sb3[k] for k in ("obs_dim", "n_actions", "net_arch")})
        if spaces is not None:
            context["kwargs"] = {"spaces": {k: v if v is not None else f"{TODO}: this key's shape"
                                            for k, v in spaces.items()},
                                 "n_actions": sb3["n_actions"], "net_arch": sb3["net_arch"],
                                 **_image_keys(state)}
        heads = [h for h in ("mlp_extractor.value_net", "value_net")
                 if any(k.startswith(h + ".") for k in keys)]
        if sb3["continuous"]:
            heads.append("log_std")
            context["box"] = action_box(source, sb3["n_actions"])
    log_stds = [] if sb3 is not None else bare_log_std(keys)
    context["heads"] = heads + [k for k in log_stds if k not in heads]
    inputs, outputs = _artifact_context(context, artifact, out, name)
    context.update(onnx_outputs=outputs,
                   **_inputs_context(inputs, outputs, spaces, artifact))
    if sb3 is None:
        context.update(_action_context(state, keys, log_stds))
    return render("policy.yaml.j2", **context)


def _image_keys(state: dict[str, Tensor]) -> dict[str, object]:
    """A ``MultiInputPolicy``'s image keys (a NatureCNN in its ``CombinedExtractor``) and
    their ``cnn_output_dim``, read from tensor names and shapes; none: ``{}``."""
    found = {m.group(1): int(t.shape[0]) for k, t in state.items()
             if (m := re.fullmatch(r"features_extractor\.extractors\.([^.]+)\.linear\.0\.weight",
                                   k))}
    if not found:
        return {}
    return {"image_keys": sorted(found), "cnn_output_dim": max(found.values())}


def _artifact_context(context: dict[str, object], artifact: Path | None, out: Path, name: str
                      ) -> tuple[list[tuple[str, list[int | str]]], list[str]]:
    """The artifact lines' context (its path, format, manifest), and its ONNX inputs and
    outputs (none for the formats that name them by position)."""
    context.update(artifact=None, artifact_format=None, manifest=False,
                   shipped=_rel(Path.cwd() / "export" / name / "policy.onnx", out.parent))
    if artifact is None:
        return [], []
    fmt = artifact_format(artifact)
    context.update(artifact=_rel(artifact, out.parent), artifact_format=fmt,
                   manifest=(artifact.parent / "manifest.json").exists())
    return _onnx_io(artifact) if fmt == "onnx" else ([], [])


def _inputs_context(inputs: list[tuple[str, list[int | str]]], outputs: list[str],
                    spaces: dict[str, list[int] | None] | None, artifact: Path | None
                    ) -> dict[str, object]:
    """``input_lines``: the inputs the artifact or the zip's Dict space declare (the
    ``policy.inputs`` block of several), and whether a layout was found."""
    found: InputLayout | None = None
    if len(inputs) > 1:
        found = layout(inputs, outputs)
        where = artifact.name if artifact is not None else ""
        lines = inputs_lines(found, f"the artifact's inputs and shapes ({where})",
                             "dict" if spaces is not None else None)
    elif spaces is not None:
        found = InputLayout(observations=list(spaces.items()), order=list(spaces))
        lines = inputs_lines(found, "the zip's Dict observation space", "dict")
    elif inputs:
        name_in, dims = inputs[0]
        lines = [f"  input_name: {_q(name_in)}   # from the artifact; shape {dims}"]
    else:
        lines = ['  input_name: "obs"   # the artifact input name (default)']
    return {"input_lines": lines, "input_layout": found is not None}


def _action_context(state: dict[str, Tensor], keys: list[str], log_stds: list[str]
                    ) -> dict[str, object]:
    """The action space guessed from tensor names and the ``distribution`` block's context
    (the log-std's source; scale and bias from ``action_scale`` / ``action_bias`` buffers)."""
    layers = _log_std_layers(keys)
    deterministic = deterministic_actor(keys)
    guess = "continuous" if log_stds or layers or deterministic or any(
        k.lower().replace("_", "").endswith("logstd") for k in keys) else "discrete"
    return {"action_guess": guess, "distribution": bool(log_stds or layers or deterministic),
            "log_stds": log_stds, "layers": layers,
            "buffers": [(n, what, _buffer_value(state, n)) for n, what in (
                ("action_scale", "(high - low) / 2"), ("action_bias", "(high + low) / 2"))]}


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
