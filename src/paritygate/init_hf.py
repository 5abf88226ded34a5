"""``paritygate init`` on a Hugging Face model directory: a ``causal_lm`` gate for a causal
LM, an ``hf_model`` (precision) gate for an encoder or any other architecture that is not one.

Reads the directory's JSON files and safetensors headers only; the architecture named in
``config.json`` decides the family, and a model the ``hf_model`` family cannot feed (pixel or
audio inputs, an encoder-decoder) is refused with the reason and the route that gates it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.init_infer import TODO, config_header, head_prefixes
from paritygate.init_infer import relative as _rel
from paritygate.init_infer import yaml_scalar as _q
from paritygate.reading import check_input, read_text

_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""Class-name endings of transformers' causal-LM classes (``LlamaForCausalLM``,
``GPT2LMHeadModel``): the decoders ``causal_lm`` generates with."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path, None, what="JSON file"))
    except json.JSONDecodeError as exc:
        raise InputError(path, None, f"unreadable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _safetensors_keys(model_dir: Path) -> list[str]:
    keys: list[str] = []
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(model_dir, None, "no *.safetensors in the model directory")
    from safetensors import safe_open

    for path in files:
        check_input(path, None, what="safetensors file")
        with safe_open(str(path), framework="numpy") as handle:
            keys += list(handle.keys())
    return keys


def _found_sampling(directory: Path) -> str:
    """``temperature=0.7, top_p=0.9`` from a directory's generation_config.json ('' if none)."""
    path = directory / "generation_config.json"
    gen = _read_json(path) if path.is_file() else {}
    return ", ".join(f"{k}={gen[k]}" for k in ("temperature", "top_p", "top_k", "max_new_tokens")
                     if k in gen)


def _lm_text(source: Path, out: Path, name: str, name_note: str, config: dict[str, Any],
             serving: Path | None = None) -> str:
    """The causal-LM config. The serving side is named only by ``serving.model_dir`` (the
    copy that ships, ``serving``; TODO when not given): its own generation_config.json,
    tokenizer, chat template and config.json dtype are the serving defaults, so no serving
    path or dtype is written that init cannot know."""
    base = out.parent
    keys = _safetensors_keys(source)
    heads = [f"{h}." for h in head_prefixes(keys)]
    dtype = _dtype(config)
    rel = _rel(source, base)
    tok_path = source / "tokenizer_config.json"
    tok = _read_json(tok_path) if tok_path.exists() else {}
    arch = _architecture(config)
    lines = [
        *config_header(source, out, name, name_note, "causal_lm"),
        "trust_remote_code: false   # never run modelling code from the model directory",
        "causal_lm:",
        f"  model_dir: {rel}   # {arch}, {len(keys)} tensors",
        f"  training_only_heads: {_q(heads)}   # "
        + ("proposed from tensor names; review" if heads else "none found in tensor names"),
        "  # The served directory's own generation_config.json, tokenizer, chat template and",
        "  # config.json dtype are the serving defaults; a serving file declared elsewhere that",
        "  # contradicts them fails as serving_file_contradicts_served_dir.",
        "  serving:",
    ]
    served_dtype = None
    if serving is not None:
        served_cfg = _read_json(serving / "config.json") if (serving / "config.json").is_file() \
            else {}
        served_dtype = _dtype(served_cfg) if served_cfg else None
        found = _found_sampling(serving)
        lines.append(f"    model_dir: {_rel(serving, base)}   # the copy that ships"
                     + (f"; its generation_config.json: {found}" if found else ""))
        if not (serving / "generation_config.json").is_file():
            lines.append("    generation_config: " + _q(
                f"{TODO}: the served sampling config ({serving.name} holds no "
                "generation_config.json): a generation_config.json or vLLM SamplingParams YAML"))
    else:
        lines.append("    model_dir: " + _q(
            f"{TODO}: the directory that ships (its own files are the serving side); "
            f"the training directory itself: {rel}"))
    lines.append("  tokenizer:")
    if tok:
        found = ", ".join(
            f"{k}={tok[k]}" for k in ("padding_side", "truncation_side") if k in tok
        )
        template = "a chat template" if tok.get("chat_template") or (
            source / "chat_template.jinja").exists() else "no chat template"
        lines.append(f"    # tokenizer found in the model directory: {found or 'defaults'}, "
                     f"{template}")
        lines.append(f"    training: {rel}")
    else:
        lines.append(f"    training: {_q(f'{TODO}: the training tokenizer directory')}")
    lines.append("    # serving: default: serving.model_dir's own tokenizer (and chat template)")
    lines += [
        "  sampling:",
        "    training: "
        + _q(f"{TODO}: the trainer's sampling YAML (temperature, top_p, top_k, max_new_tokens, "
             "stop, padding_side, ...)"),
        "    # serving: default: serving.model_dir's own generation_config.json",
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
        "    # dtype: default: the served config.json's dtype"
        + (f" ({served_dtype})" if served_dtype else "")
        + "; set serving.dtype to serve another",
        "    logprobs_mode: processed",
        "golden:",
        f"  dir: {_rel(Path.cwd() / 'golden', base)}   # baselines in "
        f"<dir>/{name}/<check_id>.json",
        "",
    ]
    return "\n".join(lines)


def _dtype(config: dict[str, Any]) -> str:
    """The float dtype config.json states (``dtype``, else ``torch_dtype``), else float32."""
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "float32"


def _architecture(config: dict[str, Any]) -> str:
    return ", ".join(config.get("architectures") or [str(config.get("model_type", "?"))])


def hf_family(model_dir: Path, config: dict[str, Any]) -> tuple[str, str]:
    """``("causal_lm" | "hf_model", reason)`` for an HF directory, from ``config.json``.

    A class ending in ``ForCausalLM``/``LMHeadModel`` is a causal LM; any other architecture
    (``BertModel``, ``BertForMaskedLM``, ``RobertaForSequenceClassification``) is gated for
    precision as ``hf_model``. Raises :class:`InputError` for a model that family cannot
    feed, naming why: its probes are token ids, so pixel or audio inputs and encoder-decoders
    (which need a decoder input) go through ``family: policy`` with a factory and .npz probes.
    """
    where = model_dir / "config.json"
    architectures = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures):
        return "causal_lm", f"{architectures[0]} is a causal LM"
    model_type = str(config.get("model_type", ""))
    if not architectures:
        try:
            from transformers.models.auto import modeling_auto as auto
        except ImportError:
            return "causal_lm", f"model_type {model_type!r} (transformers not installed)"
        if (model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                and model_type not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES):
            return "causal_lm", f"model_type {model_type!r} is a causal LM"
    route = ("gate it through family: policy with a factory and .npz probes "
             "(README: precision per layer)")
    if config.get("is_encoder_decoder"):
        raise InputError(where, "is_encoder_decoder", f"{_architecture(config)} is an "
                         f"encoder-decoder: hf_model feeds no decoder input; {route}")
    if architectures:
        try:
            import transformers

            cls = getattr(transformers, architectures[0], None)
        except ImportError:
            cls = None
        if cls is None or not hasattr(cls, "from_pretrained"):
            raise InputError(where, "architectures", f"{architectures[0]!r} is not a "
                             "transformers model class; hf_model loads one by name")
        main_input = getattr(cls, "main_input_name", "input_ids")
        if main_input != "input_ids":
            raise InputError(where, "architectures", f"{architectures[0]} takes {main_input}: "
                             f"hf_model probes are token ids; {route}")
        return "hf_model", f"{architectures[0]} is not a causal LM"
    return "hf_model", f"model_type {model_type!r} is not a causal LM"


def _hf_model_text(
    source: Path, out: Path, name: str, name_note: str, config: dict[str, Any], reason: str
) -> str:
    from paritygate.engines.hf_loading import TOKENIZER_FILES

    base = out.parent
    rel = _rel(source, base)
    keys = _safetensors_keys(source)
    has_tokenizer = any((source / f).is_file() for f in TOKENIZER_FILES)
    lines = [
        f"# Gate config written by `paritygate init {source.name}`. Edit it, then bless:",
        f"#   paritygate run {out.as_posix()} --update-golden",
        f"# {reason}: gated for precision (weights_load, precision_per_layer) as hf_model,",
        "# not as a causal LM (no generation, sampling or log-prob checks).",
        "# Every value starting with TODO must be replaced: `paritygate run` refuses the config",
        "# (exit 2, naming the key) until none is left. Paths are relative to this file.",
        f"name: {name}   # {name_note}",
        "family: hf_model",
        "seed: 0",
        "trust_remote_code: false   # never run modelling code from the model directory",
        "hf_model:",
        f"  model_dir: {rel}   # {_architecture(config)}, {len(keys)} tensors",
    ]
    if config.get("architectures"):
        lines.append(f"  # auto_class: AutoModel   # default: config.json's architectures[0] "
                     f"({config['architectures'][0]})")
    else:
        lines.append("  auto_class: AutoModel   # config.json names no architecture")
    lines.append(
        "  probes: " + _q(f"{TODO}: a .txt of texts (one a line), a .jsonl of "
                                   "{\"text\": ...}, or an .npz of input_ids "
                                   "[, attention_mask, token_type_ids]")
    )
    if has_tokenizer:
        lines.append("  tokenizer: null   # text probes use the tokenizer found in model_dir")
    else:
        lines.append("  tokenizer: " + _q(
            f"{TODO}: the tokenizer directory for text probes (model_dir holds none); "
            "with .npz probes, delete this line"))
    lines += [
        "  max_tokens: 128   # text probes truncated to this many tokens",
        "  batch_size: 8     # probes per forward",
        "precision: {streaming: auto}",
        "golden:",
        f"  dir: {_rel(Path.cwd() / 'golden', base)}   # baselines in "
        f"<dir>/{name}/<check_id>.json",
        "",
    ]
    return "\n".join(lines)


def hf_dir_text(
    source: Path, out: Path, name: str, name_note: str, serving: Path | None = None
) -> tuple[str, str]:
    """The config text for an HF model directory and the family chosen, with its reason;
    ``serving`` is the served copy of a causal LM (``serving.model_dir``)."""
    from paritygate.families.causal_lm.adapter import is_adapter_dir

    if not (source / "config.json").exists() and is_adapter_dir(source):
        return _adapter_text(source, out, name, name_note, serving)
    if not (source / "config.json").exists():
        raise InputError(source, None, "not an HF model directory (no config.json)")
    config = _read_json(source / "config.json")
    family, reason = hf_family(source, config)
    if serving is not None and not (serving / "config.json").is_file():
        raise InputError(serving, None, "not an HF model directory (no config.json)")
    if family == "causal_lm":
        text = _lm_text(source, out, name, name_note, config, serving)
        return text, f"causal_lm: {reason}"
    if serving is not None:
        raise InputError(serving, None, f"--serving is for a causal LM; {reason}")
    text = _hf_model_text(source, out, name, name_note, config, reason)
    return text, f"hf_model: {reason}"


def _adapter_text(source: Path, out: Path, name: str, name_note: str,
                  serving: Path | None) -> tuple[str, str]:
    """The causal-LM config for a PEFT adapter directory: ``model_dir`` is its base from
    ``adapter_config.json`` when that is a local directory (else a TODO naming the hub id)
    and ``adapter`` the directory itself."""
    import re

    from paritygate.families.causal_lm.adapter import local_base, read_adapter

    info = read_adapter(source, None)
    base = local_base(info)
    if serving is not None and not (serving / "config.json").is_file():
        raise InputError(serving, None, "not an HF model directory (no config.json)")
    adapter_line = (f"  adapter: {_rel(source, out.parent)}   # {info.peft_type} adapter, "
                    f"r {info.r}, lora_alpha {info.alpha:g}; merged into model_dir in memory "
                    "(peft)" if info.alpha is not None else
                    f"  adapter: {_rel(source, out.parent)}   # {info.peft_type} adapter; "
                    "merged into model_dir in memory (peft)")
    served_todo = "for an adapter, the base with the adapter merged and saved"
    if base is not None:
        config = _read_json(base / "config.json")
        family, reason = hf_family(base, config)
        if family != "causal_lm":
            raise InputError(source / "adapter_config.json", "base_model_name_or_path",
                             f"the adapter's base {base} is not a causal LM: {reason}")
        text = _lm_text(base, out, name, name_note, config, serving)
        first = re.search(r"\n  model_dir: [^\n]*", text)
        assert first is not None  # _lm_text always writes it
        line = first.group(0) + " (the adapter's base, from adapter_config.json)"
        text = text[:first.start()] + line + "\n" + adapter_line + text[first.end():]
        text = text.replace(f"`paritygate init {base.name}`", f"`paritygate init {source.name}`")
        text = text.replace(f"the training directory itself: {_rel(base, out.parent)}",
                            served_todo)
        return text, f"causal_lm: a PEFT adapter on the local base {base}"
    text = _lm_text(source, out, name, name_note, {}, serving)
    named = f"the hub id {info.base_name!r}" if info.base_name else "no base"
    todo = _q(f"{TODO}: the base model's local copy (adapter_config.json names {named}, "
              "which the gate cannot fetch)")
    text = re.sub(r"\n  model_dir: [^\n]*", lambda _: f"\n  model_dir: {todo}\n{adapter_line}",
                  text, count=1)
    text = text.replace(f"the training directory itself: {_rel(source, out.parent)}",
                        served_todo)
    return text, f"causal_lm: a PEFT adapter whose base is {named}"
