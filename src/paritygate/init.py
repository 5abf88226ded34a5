"""``paritygate init``: a commented gate config written from what a checkpoint reveals.

It reads only metadata and tensors (safetensors headers, ``weights_only`` torch
files, an SB3 zip's ``policy.pth``, ONNX graph inputs and outputs, an HF
directory's JSON files), never code. What it can infer is filled in with a
comment saying where it came from (training-only heads from tensor names, input
and output names from the artifact); what it cannot is a ``TODO:`` value, and
:func:`paritygate.load.load_config` refuses a config that still holds one
(exit 2, naming the key), so a half-edited config never runs. The gate is named after the
policy, never the training step (:func:`paritygate.init_infer.gate_name`); an HF directory
gets the family its architecture fits (:mod:`paritygate.init_hf`).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError
from paritygate.init_infer import TODO, find_todos, gate_name, gitignore_proposal, head_prefixes
from paritygate.init_infer import relative as _rel
from paritygate.init_inputs import InputLayout, inputs_block, layout, sb3_dict_spaces
from paritygate.init_policy import (
    PREPROCESSING_HINT,
    ActionInfo,
    ArtifactInfo,
    StateInfo,
    Written,
    allow_pickle,
    artifact,
    checkpoint,
    distribution,
    fill_user_factories,
    golden,
    header,
    io_names,
    probes,
    user_factories,
)
from paritygate.init_sb3 import ac_layout, sac_layout
from paritygate.init_sb3_docs import actor_critic, sb3_action, sb3_heads

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.init_yaml import Block

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


def _policy_text(written: Written, found: ArtifactInfo | None) -> str:
    """The config of a torch checkpoint or an SB3 zip (each SB3 layout its factories)."""
    from paritygate.init_sb3_docs import sac_doc, sb3_doc

    state, state_key, key_candidates = _load_state(written.source)
    sac = sac_layout(written.source, state)
    if sac is not None:
        return sac_doc(written, sac, len(state), found)
    text = sb3_doc(written, state, found)
    if text is not None:
        return text
    keys = list(state)
    sb3 = ac_layout(written.source, state)
    spaces = sb3_dict_spaces(written.source) if sb3 is not None else None
    root = header(written, "policy")
    if sb3 is None:
        policy = user_factories(root, written)
        allow_pickle(root, found)
        fill_user_factories(policy)
    else:
        allow_pickle(root, found)
        policy = root.block("policy")
        actor_critic(policy, written, sb3, spaces, state)
    info = StateInfo(len(keys), sum(int(t.numel()) for t in state.values()), state_key,
                     key_candidates, any(k.startswith("module.") for k in keys),
                     any(k.startswith("_orig_mod.") for k in keys))
    checkpoint(policy, written, info)
    log_stds = [] if sb3 is not None else bare_log_std(keys)
    heads = head_prefixes(keys) if sb3 is None else sb3_heads(sb3, keys)
    heads += [k for k in log_stds if k not in heads]
    policy.set("training_heads", heads, "training-only module prefixes: "
               + ("proposed from tensor names; review" if heads else "none found in tensor names"))
    artifact(policy, written, found)
    if sb3 is None:
        policy.todo("policy_output", "dict key (e.g. logits) or tuple index (e.g. 0) of the "
                    "policy output in the training forward's result")
    else:
        policy.set("policy_output", "mean" if sb3["continuous"] else "logits",
                   "the adapter's training forward returns a dict")
    outputs = ["mean"] if sb3 is not None and sb3["continuous"] else ["logits"]
    several = _inputs(policy, found, spaces)
    io_names(policy, found, outputs, input_name=not several)
    if sb3 is not None:
        sb3_action(policy, written, sb3)
    else:
        action = _action_info(state, keys, log_stds)
        policy.set("action_space", action.guess, "discrete | continuous; guessed from tensor "
                   "names: review")
        if action.distribution:
            distribution(policy, action)
    if not several:
        policy.comment(*PREPROCESSING_HINT)
    probes(policy, "raw observations (N, ...)", count=64)
    golden(root, written)
    return root.doc.dump()


def _inputs(policy: Block, found: ArtifactInfo | None,
            spaces: dict[str, list[int] | None] | None) -> bool:
    """``policy.call`` and ``policy.inputs`` when the artifact or the zip's Dict space declares
    several inputs; whether it did."""
    if found is not None and len(found.inputs) > 1:
        inputs_block(policy, layout(found.inputs, found.outputs),
                     f"the artifact's inputs and shapes ({found.path.name})",
                     "dict" if spaces is not None else None)
        return True
    if spaces is not None:
        inputs_block(policy, InputLayout(observations=list(spaces.items()), order=list(spaces)),
                     "the zip's Dict observation space", "dict")
        return True
    return False


def _action_info(state: dict[str, Tensor], keys: list[str], log_stds: list[str]) -> ActionInfo:
    """The action space guessed from tensor names and the ``distribution`` block's inputs
    (the log-std's source; scale and bias from ``action_scale`` / ``action_bias`` buffers)."""
    layers = _log_std_layers(keys)
    deterministic = deterministic_actor(keys)
    guess = "continuous" if log_stds or layers or deterministic or any(
        k.lower().replace("_", "").endswith("logstd") for k in keys) else "discrete"
    return ActionInfo(guess, bool(log_stds or layers or deterministic), log_stds, layers,
                      [(n, what, _buffer_value(state, n)) for n, what in (
                          ("action_scale", "(high - low) / 2"),
                          ("action_bias", "(high + low) / 2"))])


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
    written = Written(source, target, gate, name_note)
    if source.is_dir():
        if artifact is not None:
            raise InputError(Path(artifact), "--artifact", "an artifact is for a torch policy "
                             f"checkpoint file; {source} is a model directory")
        text = _directory_text(written, serving, checkpoint, reward_model, reference, notes)
    else:
        for flag, given in (("--serving", serving), ("--checkpoint", checkpoint),
                            ("--reward-model", reward_model), ("--reference", reference)):
            if given is not None:
                raise InputError(source, flag, f"{flag} is for an HF model directory or a "
                                 "trainer output_dir; this is a policy checkpoint file")
        if source.suffix.lower() == ".zip" and not zipfile.is_zipfile(source):
            raise InputError(source, None, "not a zip file")
        text = _policy_text(written, _artifact_info(source, artifact))
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


def _artifact_info(source: Path, artifact: Path | None) -> ArtifactInfo | None:
    """The artifact named (or the only one beside the checkpoint), its format and ONNX names."""
    from paritygate.reading import check_input

    found = _find_artifact(source, Path(artifact) if artifact is not None else None)
    if found is None:
        return None
    check_input(found, "--artifact", what="artifact")
    fmt = artifact_format(found)
    inputs, outputs = _onnx_io(found) if fmt == "onnx" else ([], [])
    return ArtifactInfo(found, fmt, inputs, outputs)


def _directory_text(written: Written, serving: Path | None, checkpoint: int | str | None,
                    reward_model: Path | None, reference: Path | None, notes: list[str]) -> str:
    """The config of an HF model directory, a PEFT adapter or a trainer output_dir."""
    from paritygate.init_hf import LmSource, hf_dir_text
    from paritygate.init_rl import rl_blocks
    from paritygate.trainer_output import is_output_dir, resolve_checkpoint

    if serving is not None and not Path(serving).is_dir():
        raise InputError(Path(serving), "--serving",
                         "--serving takes the served HF model directory of a causal LM")
    source = written.source
    record = None
    if is_output_dir(source) or checkpoint is not None:
        record = resolve_checkpoint(
            source, checkpoint, key="--checkpoint" if checkpoint is not None else None)
    inspected = record.path if record is not None else source
    src = LmSource(inspected, {}, record=record if record is not None and record.output_dir
                   is not None else None, selector=checkpoint)

    def rl(lm_src: LmSource, lm: Block) -> list[str]:
        return rl_blocks(lm, inspected, written, reward_model, reference)

    text, family, rl_notes = hf_dir_text(
        written, src, Path(serving) if serving is not None else None, rl,
        {"--reward-model": reward_model, "--reference": reference})
    notes.append(f"family {family}")
    notes += rl_notes
    if src.record is not None:
        notes.append(f"trainer output_dir: inspected {src.record.describe()}; run gates "
                     + (f"checkpoint-{checkpoint}" if isinstance(checkpoint, int)
                        else "the latest checkpoint-N")
                     + " (paritygate run --checkpoint N for another, --all for each)")
    return text
