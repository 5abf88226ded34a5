"""``paritygate init``: a commented gate config written from what a checkpoint reveals.

It reads only metadata and tensors (safetensors headers, ``weights_only`` torch
files, an SB3 zip's ``policy.pth``, ONNX graph inputs and outputs, an HF
directory's JSON files), never code. What it can infer is filled in with a
comment saying where it came from (training-only heads from tensor names, input
and output names from the artifact); what it cannot is a ``TODO:`` value, and
:func:`paritygate.config.load_config` refuses a config that still holds one
(exit 2, naming the key), so a half-edited config never runs.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.errors import InputError

TODO = "TODO"
"""Values starting with this marker are unfilled; ``load_config`` rejects them."""

_HEAD_WORDS = ("value", "critic", "aux", "v_head", "vf_", "q_head", "baseline", "reward_head")
"""Module-name starts that usually mark training-only heads (PPO critics, auxiliary losses)."""
_ATTENTION_WORDS = ("attn", "attention")
"""Parts of a module name that mark an attention block: nothing inside one is a head."""
_ATTENTION_PROJECTIONS = frozenset({"query", "key", "q", "k", "q_proj", "k_proj", "qk"})
"""Query/key projections: a ``value`` beside them is the attention's value projection."""


@dataclass
class WrittenConfig:
    """The config ``paritygate init`` wrote and the dotted keys still marked TODO."""

    path: Path
    todos: list[str] = field(default_factory=list)


def find_todos(data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of every value in a parsed config that still starts with ``TODO``."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            found += find_todos(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += find_todos(value, f"{prefix}[{i}]")
    elif isinstance(data, str) and data.strip().upper().startswith(TODO):
        found.append(prefix)
    return found


def head_prefixes(keys: list[str]) -> list[str]:
    """Likely training-only heads: the shortest module prefix whose last part looks like one.

    A head hangs off the model beside its trunk. The value projection of an attention block
    (``attention.self.value`` beside ``query`` and ``key``) shares the word but is part of the
    trunk: a part inside an attention module (an enclosing part naming ``attn``/``attention``)
    or beside query/key projections is never proposed."""
    children: dict[str, set[str]] = {}
    for key in keys:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            children.setdefault(".".join(parts[: depth - 1]), set()).add(parts[depth - 1].lower())
    heads: list[str] = []
    for key in keys:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            if not parts[depth - 1].lower().startswith(_HEAD_WORDS):
                continue
            enclosing = [part.lower() for part in parts[: depth - 1]]
            siblings = children[".".join(parts[: depth - 1])]
            if any(word in part for part in enclosing for word in _ATTENTION_WORDS) or (
                siblings & _ATTENTION_PROJECTIONS
            ):
                continue
            prefix = ".".join(parts[:depth])
            if prefix not in heads:
                heads.append(prefix)
            break
    return heads


def _q(value: Any) -> str:
    """A YAML scalar (JSON strings and numbers are valid YAML)."""
    return json.dumps(value)


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def _gate_name(source: Path, name: str | None) -> str:
    raw = name or (source.name if source.is_dir() else source.stem)
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "my-policy"
    return cleaned if cleaned[0].isalnum() else f"g{cleaned}"


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
    return {
        "obs_dim": int(first.shape[1]),
        "n_actions": int(keys["action_net.weight"].shape[0]),
        "net_arch": [int(keys[k].shape[0]) for _, k in layers],
        "continuous": "log_std" in keys,
    }


def _policy_text(source: Path, out: Path, name: str, artifact: Path | None) -> str:
    from paritygate.checkpoints import load_state_dict

    state = load_state_dict(source)
    keys = list(state)
    heads = head_prefixes(keys)
    sb3 = _sb3_layout(source, state)
    base = out.parent
    n_params = sum(int(t.numel()) for t in state.values())
    lines = [
        f"# Gate config written by `paritygate init {source.name}`. Edit it, then bless:",
        f"#   paritygate run {out.as_posix()} --update-golden",
        "# Every value starting with TODO must be replaced: `paritygate run` refuses the config",
        "# (exit 2, naming the key) until none is left. Paths are relative to this file.",
        f"name: {name}",
        "family: policy",
        "seed: 0",
    ]
    if sb3 is None:
        lines.append(
            f"python_path: [{_q(_rel(Path.cwd(), base))}]   # folders (relative to this file) "
            "the module:callable names below import from: here the folder init ran in"
        )
    lines.append("policy:")
    if sb3 is not None:
        kwargs = {k: sb3[k] for k in ("obs_dim", "n_actions", "net_arch")}
        lines += [
            "  # Stable-Baselines3 ActorCriticPolicy (read through policy.pth, weights_only):",
            f"  # obs_dim, n_actions and net_arch read from the tensor shapes of {source.name}.",
            "  training_factory: paritygate.adapters.sb3:training_policy    # forward -> "
            "{logits, value}",
            "  inference_factory: paritygate.adapters.sb3:inference_policy  # actor path only",
            "  factory_kwargs: {"
            + ", ".join(f"{k}: {json.dumps(v)}" for k, v in kwargs.items())
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
    if any(k.startswith("module.") for k in keys):
        lines.append("  # note: keys carry DDP's 'module.' prefix; weights_load will name it")
    if any(k.startswith("_orig_mod.") for k in keys):
        lines.append("  # note: keys carry torch.compile's '_orig_mod.' prefix; weights_load "
                     "will name it")
    if sb3 is not None:
        heads = [h for h in ("mlp_extractor.value_net", "value_net") if any(
            k.startswith(h + ".") for k in keys)]
    head_note = "proposed from tensor names; review" if heads else "none found in tensor names"
    lines.append(f"  training_heads: {_q(heads)}   # training-only module prefixes: {head_note}")
    onnx_inputs: list[tuple[str, list[Any]]] = []
    onnx_outputs: list[str] = []
    if artifact is not None:
        onnx_inputs, onnx_outputs = _onnx_io(artifact)
        lines.append(f"  artifact: {_rel(artifact, base)}")
        manifest = artifact.parent / "manifest.json"
        lines.append(
            "  # manifest.json beside the artifact found: export_integrity checks its sha256"
            if manifest.exists()
            else "  # no manifest.json beside the artifact: provenance is proven numerically"
        )
        if len(onnx_inputs) > 1:
            lines.append(f"  # {TODO}: the artifact has {len(onnx_inputs)} inputs "
                         f"({', '.join(n for n, _ in onnx_inputs)}); the gate feeds one")
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
    if onnx_inputs:
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
        guess = "continuous" if any(k.endswith("log_std") for k in keys) else "discrete"
        lines.append(f"  action_space: {guess}   # discrete | continuous; guessed from tensor "
                     "names: review")
    lines += [
        "  # preprocessing:          # both sides' observation preprocessing, if any",
        "  #   training: mypkg.obs:normalize_torch   # fn(raw, stats_path=..., **kwargs)",
        "  #   serving: myserving.obs:normalize_numpy",
        "  #   stats: obs_norm.json",
        "  #   discrete_features: []",
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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(path, None, f"unreadable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _safetensors_keys(model_dir: Path) -> list[str]:
    keys: list[str] = []
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(model_dir, None, "no *.safetensors in the model directory")
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="numpy") as handle:
            keys += list(handle.keys())
    return keys


def _lm_text(source: Path, out: Path, name: str) -> str:
    base = out.parent
    config = _read_json(source / "config.json")
    keys = _safetensors_keys(source)
    heads = [f"{h}." for h in head_prefixes(keys)]
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        dtype = "float32"
    rel = _rel(source, base)
    tok_path = source / "tokenizer_config.json"
    tok = _read_json(tok_path) if tok_path.exists() else {}
    gen_path = source / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.exists() else {}
    arch = ", ".join(config.get("architectures") or [config.get("model_type", "?")])
    lines = [
        f"# Gate config written by `paritygate init {source.name}`. Edit it, then bless:",
        f"#   paritygate run {out.as_posix()} --update-golden",
        "# Every value starting with TODO must be replaced: `paritygate run` refuses the config",
        "# (exit 2, naming the key) until none is left. Paths are relative to this file.",
        f"name: {name}",
        "family: causal_lm",
        "seed: 0",
        "trust_remote_code: false   # never run modelling code from the model directory",
        "causal_lm:",
        f"  model_dir: {rel}   # {arch}, {len(keys)} tensors",
        f"  training_only_heads: {_q(heads)}   # "
        + ("proposed from tensor names; review" if heads else "none found in tensor names"),
        "  tokenizer:",
    ]
    if tok:
        found = ", ".join(
            f"{k}={tok[k]}" for k in ("padding_side", "truncation_side") if k in tok
        )
        template = "a chat template" if tok.get("chat_template") or (
            source / "chat_template.jinja").exists() else "no chat template"
        lines.append(f"    # tokenizer found in the model directory: {found or 'defaults'}, "
                     f"{template}")
        lines.append(f"    training: {rel}")
        lines.append(f"    serving: {_q(f'{TODO}: the serving tokenizer directory (or {rel})')}")
    else:
        lines.append(f"    training: {_q(f'{TODO}: the training tokenizer directory')}")
        lines.append(f"    serving: {_q(f'{TODO}: the serving tokenizer directory')}")
    lines += [
        "  sampling:",
        "    training: "
        + _q(f"{TODO}: the trainer's sampling YAML (temperature, top_p, top_k, max_new_tokens, "
             "stop, padding_side, ...)"),
    ]
    if gen:
        shown = ", ".join(
            f"{k}={gen[k]}" for k in ("temperature", "top_p", "top_k", "max_new_tokens")
            if k in gen
        )
        lines.append(f"    serving: {rel}/generation_config.json   # found: {shown}; or a vLLM "
                     "SamplingParams YAML")
    else:
        lines.append("    serving: " + _q(f"{TODO}: the serving sampling config "
                                           "(generation_config.json or vLLM SamplingParams)"))
    lines += [
        "    allow: []   # accepted differences: - {field: ..., reason: ...}",
        "  probes: " + _q(f"{TODO}: a .jsonl of prompts, one {{\"id\", \"text\"}} or "
                          "{\"id\", \"messages\"} per line"),
        "  max_prompt_tokens: 128",
        "  engines: [hf]   # add vllm on a GPU runner",
        "  training:",
        "    logprob_fn: " + _q(f"{TODO}: your trainer's log-prob function, module:callable "
                              "(or paritygate.families.causal_lm.logprobs:compute_logprobs)"),
        "    logprobs_mode: processed   # processed: temperature/top-k/top-p applied; raw",
        f"    dtype: {dtype}   # from config.json",
        "  engine:",
        f"    dtype: {dtype}   # the served dtype: float32 | bfloat16 | float16",
        "    logprobs_mode: processed",
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
) -> WrittenConfig:
    """Inspect ``source`` (a checkpoint file or an HF model directory) and write a config.

    Never overwrites: an existing ``out`` is an :class:`InputError`.
    """
    source = Path(source)
    if not source.exists():
        raise InputError(source, None, "checkpoint or model directory not found")
    gate_name = _gate_name(source, name)
    target = Path(out) if out is not None else Path("configs") / f"{gate_name}.yaml"
    if target.exists():
        raise InputError(target, None, "already exists; refusing to overwrite (choose --out)")
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        if not (source / "config.json").exists():
            raise InputError(source, None, "not an HF model directory (no config.json)")
        text = _lm_text(source, target, gate_name)
    else:
        if source.suffix.lower() == ".zip" and not zipfile.is_zipfile(source):
            raise InputError(source, None, "not a zip file")
        text = _policy_text(source, target, gate_name, _find_artifact(source, artifact))
    import yaml

    todos = find_todos(yaml.safe_load(text))
    target.write_text(text, encoding="utf-8")
    return WrittenConfig(target, todos)
