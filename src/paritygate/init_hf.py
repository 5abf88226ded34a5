"""``paritygate init`` on a Hugging Face model directory: a ``causal_lm`` gate for a causal
LM, an ``hf_model`` (precision) gate for an encoder or any other architecture that is not one.

Reads the directory's JSON files and safetensors headers only; the architecture named in
``config.json`` decides the family, and a model the ``hf_model`` family cannot feed (pixel or
audio inputs, an encoder-decoder) is refused with the reason and the route that gates it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError
from paritygate.init_infer import head_prefixes
from paritygate.init_policy import Written, golden, header
from paritygate.reading import check_input, read_text

if TYPE_CHECKING:
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.init_yaml import Block
    from paritygate.trainer_output import TrainerCheckpoint

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


@dataclass
class LmSource:
    """What a causal-LM config is written from: the model directory inspected (an adapter's
    base, a trainer's ``checkpoint-N``), and how the config names it."""

    model_dir: Path
    config: dict[str, Any]
    adapter: AdapterInfo | None = None
    base_found: bool = True
    """An adapter's base is a local directory (else ``model_dir`` is TODO)."""
    record: TrainerCheckpoint | None = None
    """The trainer output_dir the model directory was picked from, and the pick."""
    selector: int | str | None = None


def _model_lines(lm: Block, written: Written, src: LmSource, keys: list[str]) -> None:
    """``model_dir`` (the directory, the trainer output_dir with its ``checkpoint`` pick, or an
    adapter's base) and ``adapter``."""
    what = f"{_architecture(src.config)}, {len(keys)} tensors"
    record = src.record
    if record is not None and record.output_dir is not None:
        lm.set("model_dir", written.rel(record.output_dir), f"trainer output_dir, "
               f"{len(record.steps)} checkpoint(s): {', '.join(map(str, record.steps))}")
        pick = src.selector if src.selector is not None else "latest"
        lm.set("checkpoint", pick, f"the checkpoint-N gated: a step, latest or final "
               f"(inspected: {record.path.name}, {what})")
    elif src.adapter is not None and not src.base_found:
        named = f"the hub id {src.adapter.base_name!r}" if src.adapter.base_name else "no base"
        lm.todo("model_dir", f"the base model's local copy (adapter_config.json names {named}, "
                "which the gate cannot fetch)")
    else:
        lm.set("model_dir", written.rel(src.model_dir), what + (
            " (the adapter's base, from adapter_config.json)" if src.adapter is not None else ""))
    if src.adapter is not None:
        info = src.adapter
        rank = f", r {info.r}, lora_alpha {info.alpha:g}" if info.alpha is not None else ""
        lm.set("adapter", written.rel(info.directory), f"{info.peft_type} adapter{rank}; merged "
               "into model_dir in memory (peft)")


def _serving_lines(lm: Block, written: Written, src: LmSource, serving: Path | None) -> None:
    """``serving.model_dir``: the copy that ships (``--serving``), else TODO."""
    lm.comment("The served directory's own generation_config.json, tokenizer, chat template and",
               "config.json dtype are the serving defaults; a serving file declared elsewhere "
               "that", "contradicts them fails as serving_file_contradicts_served_dir.")
    block = lm.block("serving")
    if serving is None:
        itself = ("null: the gated checkpoint-N as saved" if src.record is not None
                  and src.record.output_dir is not None
                  else "the base with the adapter merged and saved" if src.adapter is not None
                  else f"null: the training directory itself ({written.rel(src.model_dir)})")
        block.todo("model_dir", "the directory that ships (its own files are the serving side); "
                   + itself)
        return
    found = _found_sampling(serving)
    block.set("model_dir", written.rel(serving), "the copy that ships"
              + (f"; its generation_config.json: {found}" if found else ""))
    if not (serving / "generation_config.json").is_file():
        block.todo("generation_config", f"the served sampling config ({serving.name} holds no "
                   "generation_config.json): a generation_config.json or vLLM SamplingParams YAML")


def _tokenizer_lines(lm: Block, written: Written, src: LmSource) -> None:
    tok_path = src.model_dir / "tokenizer_config.json"
    tok = _read_json(tok_path) if tok_path.exists() else {}
    block = lm.block("tokenizer")
    if tok:
        found = ", ".join(f"{k}={tok[k]}" for k in ("padding_side", "truncation_side") if k in tok)
        template = "a chat template" if tok.get("chat_template") or (
            src.model_dir / "chat_template.jinja").exists() else "no chat template"
        block.comment(f"tokenizer found in the model directory: {found or 'defaults'}, "
                      f"{template}")
        if src.record is not None and src.record.output_dir is not None:
            block.set("training", None, "default: the gated checkpoint's own")
        else:
            block.set("training", written.rel(src.model_dir))
    else:
        block.todo("training", "the training tokenizer directory")
    block.comment("serving: default: serving.model_dir's own tokenizer (and chat template)")


def lm_doc(written: Written, src: LmSource, serving: Path | None,
           rl: Callable[[Block], None] | None = None) -> str:
    """The causal-LM config. The serving side is named only by ``serving.model_dir`` (the
    copy that ships, ``serving``; TODO when not given): its own generation_config.json,
    tokenizer, chat template and config.json dtype are the serving defaults, so no serving
    path or dtype is written that init cannot know. ``rl`` adds the reward and reference
    blocks."""
    keys = _safetensors_keys(src.model_dir)
    heads = [f"{h}." for h in head_prefixes(keys)]
    root = header(written, "causal_lm")
    root.set("trust_remote_code", False, "never run modelling code from the model directory")
    lm = root.block("causal_lm")
    _model_lines(lm, written, src, keys)
    lm.set("training_only_heads", heads, "proposed from tensor names; review" if heads
           else "none found in tensor names")
    _serving_lines(lm, written, src, serving)
    _tokenizer_lines(lm, written, src)
    sampling = lm.block("sampling")
    sampling.todo("training", "the trainer's sampling YAML (temperature, top_p, top_k, "
                  "max_new_tokens, stop, padding_side, ...)")
    sampling.comment("serving: default: serving.model_dir's own generation_config.json")
    sampling.set("allow", [], "accepted differences: - {field: ..., reason: ...}")
    lm.todo("probes", 'a .jsonl of prompts, one {"id", "text"} or {"id", "messages"} per line')
    lm.set("max_prompt_tokens", 128)
    lm.set("engines", ["hf"], "add vllm on a GPU runner")
    training = lm.block("training")
    training.todo("logprob_fn", "your trainer's log-prob function, module:callable (or "
                  "paritygate.families.causal_lm.logprobs:compute_logprobs)")
    training.set("logprobs_mode", "processed", "processed: temperature/top-k/top-p applied; raw")
    training.set("dtype", _dtype(src.config), "from config.json")
    engine = lm.block("engine")
    served_dtype = None
    if serving is not None and (serving / "config.json").is_file():
        served_dtype = _dtype(_read_json(serving / "config.json"))
    engine.comment("dtype: default: the served config.json's dtype"
                   + (f" ({served_dtype})" if served_dtype else "")
                   + "; set serving.dtype to serve another")
    engine.set("logprobs_mode", "processed")
    if rl is not None:
        rl(lm)
    golden(root, written)
    return root.doc.dump()


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


def _hf_model_doc(written: Written, config: dict[str, Any], reason: str) -> str:
    from paritygate.engines.hf_loading import TOKENIZER_FILES

    source = written.source
    keys = _safetensors_keys(source)
    has_tokenizer = any((source / f).is_file() for f in TOKENIZER_FILES)
    root = header(written, "hf_model", extra=(
        f"{reason}: gated for precision (weights_load, precision_per_layer) as hf_model,",
        "not as a causal LM (no generation, sampling or log-prob checks)."))
    root.set("trust_remote_code", False, "never run modelling code from the model directory")
    block = root.block("hf_model")
    block.set("model_dir", written.rel(source), f"{_architecture(config)}, {len(keys)} tensors")
    if config.get("architectures"):
        block.comment(f"auto_class: AutoModel   # default: config.json's architectures[0] "
                      f"({config['architectures'][0]})")
    else:
        block.set("auto_class", "AutoModel", "config.json names no architecture")
    block.todo("probes", 'a .txt of texts (one a line), a .jsonl of {"text": ...}, or an .npz '
               "of input_ids [, attention_mask, token_type_ids]")
    if has_tokenizer:
        block.set("tokenizer", None, "text probes use the tokenizer found in model_dir")
    else:
        block.todo("tokenizer", "the tokenizer directory for text probes (model_dir holds none); "
                   "with .npz probes, delete this line")
    block.set("max_tokens", 128, "text probes truncated to this many tokens")
    block.set("batch_size", 8, "probes per forward")
    root.set("precision", {"streaming": "auto"})
    golden(root, written)
    return root.doc.dump()


def hf_dir_text(written: Written, src: LmSource, serving: Path | None,
                rl: Callable[[LmSource, Block], list[str]] | None = None,
                lm_flags: dict[str, Path | None] | None = None) -> tuple[str, str, list[str]]:
    """The config for an HF model directory (a trainer's checkpoint, a PEFT adapter), the family
    chosen with its reason, and the notes of ``rl`` (the RL loop's blocks, for a causal LM).
    ``lm_flags`` are the flags given that only a causal LM honours (``--reward-model``):
    bad input for another family."""
    from paritygate.families.causal_lm.adapter import is_adapter_dir

    source = src.model_dir
    if not (source / "config.json").exists() and is_adapter_dir(source):
        return _adapter_doc(written, src, serving, rl)
    if not (source / "config.json").exists():
        raise InputError(source, None, "not an HF model directory (no config.json)")
    src.config = _read_json(source / "config.json")
    family, reason = hf_family(source, src.config)
    if serving is not None and not (serving / "config.json").is_file():
        raise InputError(serving, None, "not an HF model directory (no config.json)")
    if family == "causal_lm":
        notes: list[str] = []
        text = lm_doc(written, src, serving, _rl_adder(rl, src, notes))
        return text, f"causal_lm: {reason}", notes
    for flag, given in {"--serving": serving, **(lm_flags or {})}.items():
        if given is not None:
            raise InputError(given, flag, f"{flag} is for a causal LM; {reason}")
    return _hf_model_doc(written, src.config, reason), f"hf_model: {reason}", []


def _rl_adder(rl: Callable[[LmSource, Block], list[str]] | None, src: LmSource,
              notes: list[str]) -> Callable[[Block], None] | None:
    if rl is None:
        return None

    def add(lm: Block) -> None:
        notes.extend(rl(src, lm))
    return add


def _adapter_doc(written: Written, src: LmSource, serving: Path | None,
                 rl: Callable[[LmSource, Block], list[str]] | None) -> tuple[str, str, list[str]]:
    """The causal-LM config for a PEFT adapter directory: ``model_dir`` is its base from
    ``adapter_config.json`` when that is a local directory (else a TODO naming the hub id)
    and ``adapter`` the directory itself."""
    from paritygate.families.causal_lm.adapter import local_base, read_adapter

    info = read_adapter(src.model_dir, None)
    base = local_base(info)
    if serving is not None and not (serving / "config.json").is_file():
        raise InputError(serving, None, "not an HF model directory (no config.json)")
    notes: list[str] = []
    if base is not None:
        config = _read_json(base / "config.json")
        family, reason = hf_family(base, config)
        if family != "causal_lm":
            raise InputError(src.model_dir / "adapter_config.json", "base_model_name_or_path",
                             f"the adapter's base {base} is not a causal LM: {reason}")
        lm_src = LmSource(base, config, info, True)
        text = lm_doc(written, lm_src, serving, _rl_adder(rl, lm_src, notes))
        return text, f"causal_lm: a PEFT adapter on the local base {base}", notes
    lm_src = LmSource(src.model_dir, {}, info, False)
    text = lm_doc(written, lm_src, serving, _rl_adder(rl, lm_src, notes))
    named = f"the hub id {info.base_name!r}" if info.base_name else "no base"
    return text, f"causal_lm: a PEFT adapter whose base is {named}", notes
