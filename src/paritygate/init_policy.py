"""The ``policy`` config ``paritygate init`` writes for a torch checkpoint or an SB3 actor-critic
zip (PPO, A2C, ``MultiInputPolicy``), built as a YAML document (:mod:`paritygate.init_yaml`).

What the tensors and the artifact say is filled in with a note on where it came from; what
they cannot say is a ``TODO:`` value. The shared parts (header, artifact, probes, golden) serve
the other SB3 layouts too (:mod:`paritygate.init_sb3`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from paritygate.init_infer import relative
from paritygate.init_yaml import Block, ConfigDoc

PROBES_TODO = ("module:callable(count, seed) -> {what}; or replace this line with "
               "file: probes.npy")


@dataclass
class Written:
    """Where the config goes and what it is named: what every part of a config needs."""

    source: Path
    out: Path
    name: str
    name_note: str

    def rel(self, path: Path) -> str:
        """``path`` relative to the config's folder (configs name paths relative to themselves)."""
        return relative(path, self.out.parent)


@dataclass
class ArtifactInfo:
    """The artifact ``--artifact`` names (or the only one beside the checkpoint)."""

    path: Path
    format: str
    """``onnx``, ``torchscript`` or ``torch_export``, told by the file."""
    inputs: list[tuple[str, list[int | str]]] = field(default_factory=list)
    """ONNX graph inputs (name, shape); empty for the formats that name them by position."""
    outputs: list[str] = field(default_factory=list)


def header(written: Written, family: str, *, extra: tuple[str, ...] = ()) -> Block:
    """The root of a new document: the header every config shares (how to bless, the TODO
    rule), the gate's name with where it came from, the family and the seed."""
    doc = ConfigDoc([
        f"Gate config written by `paritygate init {written.source.name}`. Edit it, then bless:",
        f"  paritygate run {written.out.as_posix()} --update-golden",
        *extra,
        "Every value starting with TODO must be replaced: `paritygate run` refuses the config",
        "(exit 2, naming the key) until none is left. Paths are relative to this file.",
    ])
    root = doc.root
    root.set("name", written.name, written.name_note)
    root.set("family", family)
    root.set("seed", 0)
    return root


def golden(root: Block, written: Written) -> None:
    """The ``golden`` block: where the baselines go."""
    block = root.block("golden")
    block.set("dir", written.rel(Path.cwd() / "golden"),
              f"baselines in <dir>/{written.name}/<check_id>.json")


def probes(policy: Block, what: str, *, count: int | None = None) -> None:
    """``policy.probes`` with its generator TODO (a callable or a ``file:``)."""
    block = policy.block("probes", "raw observations the checks feed")
    block.todo("generator", PROBES_TODO.format(what=what))
    if count is not None:
        block.set("count", count)
        block.set("seed", 0)


def artifact(policy: Block, written: Written, found: ArtifactInfo | None) -> None:
    """``policy.artifact`` with its format and manifest notes, or the commented hint of the
    export made on the fly."""
    if found is None:
        shipped = written.rel(Path.cwd() / "export" / written.name / "policy.onnx")
        policy.comment(f"artifact: {shipped}   # omitted: exported on the fly on every run; "
                       f"`paritygate export {written.out.as_posix()}` writes this one + "
                       "manifest.json")
        return
    policy.set("artifact", written.rel(found.path))
    if found.format == "torchscript":
        policy.set("artifact_format", "torchscript", "told by the file (a torch.jit.save "
                   "archive): inputs and outputs are named by position, as input_name / "
                   "output_names below")
    elif found.format == "torch_export":
        policy.set("artifact_format", "torch_export", "told by the file (a torch.export "
                   "program): loaded only with allow_pickle (above); inputs and outputs are "
                   "named by position")
    policy.comment("manifest.json beside the artifact found: export_integrity checks its sha256"
                   if (found.path.parent / "manifest.json").exists() else
                   "no manifest.json beside the artifact: provenance is proven numerically")


def io_names(policy: Block, found: ArtifactInfo | None, default_outputs: list[str], *,
             input_name: bool = True) -> None:
    """``input_name`` (unless ``policy.inputs`` names several) and ``output_names``: the ONNX
    artifact's, else the defaults the factories serve."""
    if not input_name:
        pass
    elif found is not None and len(found.inputs) == 1:
        name, dims = found.inputs[0]
        policy.set("input_name", name, f"from the artifact; shape {dims}")
    elif found is None or not found.inputs:
        policy.set("input_name", "obs", "the artifact input name (default)")
    if found is not None and found.outputs:
        policy.set("output_names", found.outputs, "from the artifact; first = policy")
    else:
        policy.set("output_names", default_outputs, "outputs the artifact must declare")


def allow_pickle(root: Block, found: ArtifactInfo | None) -> None:
    """A ``torch.export`` artifact is unpickled in part: ``allow_pickle`` is TODO, never set."""
    if found is not None and found.format == "torch_export":
        root.todo("allow_pickle", "true to load this torch.export program: torch.export.load "
                  "unpickles parts of it (runs code from the file); set it only for a file you "
                  "trust")


@dataclass
class StateInfo:
    """What the checkpoint's tensors say about themselves."""

    n_keys: int
    n_values: int
    state_key: str | None = None
    key_candidates: list[str] = field(default_factory=list)
    ddp: bool = False
    compiled: bool = False


def checkpoint(policy: Block, written: Written, info: StateInfo) -> None:
    """``policy.checkpoint``, the state dict's key and the prefixes weights_load will name."""
    policy.set("checkpoint", written.rel(written.source),
               f"{info.n_keys} tensors, {info.n_values:,} values")
    if len(info.key_candidates) > 1:
        policy.todo("state_dict_key", "the key of the policy's state dict, one of "
                    + ", ".join(info.key_candidates), f"proposed below from {info.state_key}")
    elif info.key_candidates:
        policy.set("state_dict_key", info.state_key, "a training checkpoint: the only mapping "
                   "of tensors found under its keys")
    elif info.state_key is not None:
        policy.set("state_dict_key", info.state_key, "a training checkpoint: its state dict "
                   "sits under this key (found by name; dotted when nested)")
    if info.ddp:
        policy.comment("note: keys carry DDP's 'module.' prefix; weights_load will name it")
    if info.compiled:
        policy.comment("note: keys carry torch.compile's '_orig_mod.' prefix; weights_load "
                       "will name it")


def user_factories(root: Block, written: Written) -> Block:
    """A torch checkpoint's ``python_path`` and the ``policy`` block with its factories TODO:
    only the user's code builds the model."""
    from paritygate.init_infer import python_path

    folders, why = python_path(Path.cwd())
    root.set("python_path", [written.rel(f) for f in folders], "folders (relative to this file) "
             f"the module:callable names below import from: {why}")
    return root.block("policy")


def fill_user_factories(policy: Block) -> None:
    policy.comment("module:callable(**factory_kwargs) -> nn.Module; importable where the gate "
                   "runs.")
    policy.todo("training_factory", "module:callable building the training model, with heads")
    policy.todo("inference_factory", "module:callable building the serving model, heads removed")
    policy.set("factory_kwargs", {}, "keyword arguments passed to both factories")
    policy.comment("factory_path_kwargs: [name]   # factory_kwargs holding paths, resolved "
                   "relative to this file")


PREPROCESSING_HINT = (
    "preprocessing:          # both sides' observation preprocessing, if any",
    "  training: mypkg.obs:normalize_torch   # fn(raw, stats_path=..., **kwargs)",
    "  serving: myserving.obs:normalize_numpy",
    "  stats: obs_norm.json",
    "  discrete_features: []",
)


@dataclass
class ActionInfo:
    """A torch checkpoint's action space, guessed from tensor names, and its distribution."""

    guess: str
    distribution: bool
    log_stds: list[str]
    layers: list[str]
    buffers: list[tuple[str, str, float | list[float] | None]]


def distribution(policy: Block, action: ActionInfo) -> None:
    """The ``distribution`` block of a torch checkpoint's continuous actor: what its tensors
    say (a bare log-std, a log-std layer, scale and bias buffers), the rest TODO."""
    if not action.log_stds and not action.layers:
        block = policy.block("distribution", "a deterministic actor (TD3/DDPG: an actor target "
                             "or Q-networks, no log-std); review")
        block.set("type", "deterministic")
    else:
        block = policy.block("distribution", "the Gaussian (README: continuous actions); review")
        if action.log_stds:
            block.set("log_std", "parameter", f"{action.log_stds[0]!r} is a bare tensor of the "
                      "checkpoint (a training head: the served actor returns the mean)")
            block.set("log_std_key", action.log_stds[0])
        else:
            block.set("log_std", "output", f"{action.layers[0]!r} computes it in the forward")
            block.todo("log_std_key", "dict key or tuple index of the log-std in the training "
                       "forward's result")
            block.todo("log_std_clamp", "[min, max] the training side clamps the raw log-std "
                       "to, or null")
    block.todo("squash", "tanh (SAC, TD3) | clip (clipped to the action box) | none")
    for name, what, value in action.buffers:
        if value is None:
            block.todo(name, f"{what} of the action box")
        else:
            block.set(name, value, f"from the checkpoint's {name} buffer")
    if not action.log_stds:
        block.todo("serving_output", "mean (the artifact serves the policy output u) | action "
                   "(the env action)")
