"""Sampling configs: read the trainer's and the server's, normalise, and diff them field by field.

Three formats are read: an HF ``generation_config.json`` (absent fields take HF's
defaults, e.g. ``top_k: 50`` and greedy decoding), a vLLM sampling-parameters YAML
(absent fields take vLLM's defaults, ``max_tokens: 16``, no top-k) and the
trainer's YAML (HF or vLLM names, absent fields take the neutral defaults).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.config.sampling_fields import NO_EOS, NOT_COMPARED, OFF_POLICY, is_neutral
from paritygate.engines.generation import SamplingSpec
from paritygate.errors import InputError
from paritygate.reading import MAX_CONFIG_BYTES, read_text
from paritygate.reading_text import parse_json, parse_yaml

COMPARED_FIELDS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "eos_token_id",
    "ignore_eos",
    "do_sample",
    "padding_side",
    "truncation_side",
    "use_cache",
    "dtype",
)
MAX_NEW_TOKENS = 2**17
"""``max_new_tokens`` / ``min_new_tokens`` at most 131,072: the longest context windows served
today; a larger value is no length limit, and a generation that never meets EOS would run
for hours."""
MAX_STOP_STRINGS = 1024
"""A sampling config lists at most 1,024 stop strings: real ones list a handful, and each is
matched against every generated token's text."""
MAX_STOP_CHARS = 1024
"""A stop string is at most 1,024 characters (longer is no stop marker but a document)."""
ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "stop_strings": "stop",
           "response_length": "max_new_tokens"}
"""Other engines' names of compared fields (``response_length``: verl's rollout config)."""
IGNORED = {
    "bos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
    "seed",
    "n",
    "logprobs",
    "prompt_logprobs",
    "num_return_sequences",
    "output_scores",
    "output_logits",
    "output_attentions",
    "output_hidden_states",
    "return_dict_in_generate",
}
"""Token ids (tokenizer_parity compares them), bookkeeping, and per-request settings.
``eos_token_id`` is compared: HF ``generate`` stops on the generation config's EOS ids,
whatever the tokenizer says."""

FORMATS = ("trainer", "hf_generation_config", "vllm")
HF_MARKERS = {
    "transformers_version", "_from_model_config", "max_length", "num_beams", "stop_strings",
    "do_sample", "min_length", "typical_p", "no_repeat_ngram_size", "bos_token_id",
    "eos_token_id", "decoder_start_token_id", "max_new_tokens", "min_new_tokens",
}
VLLM_MARKERS = {
    "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "n", "best_of",
    "presence_penalty", "frequency_penalty", "ignore_eos", "stop_token_ids",
    "skip_special_tokens", "include_stop_str_in_output", "logit_bias",
}
TRAINER_MARKERS = {"padding_side", "truncation_side", "dtype"}

_NEUTRAL: dict[str, object] = {
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "stop_token_ids": [],
    "ignore_eos": False,
}
HF_DEFAULTS: dict[str, object] = {
    **_NEUTRAL,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "repetition_penalty": 1.0,
    "max_new_tokens": 20,
    "min_new_tokens": 0,
    "stop": [],
    "do_sample": False,
    "use_cache": True,
}
VLLM_DEFAULTS: dict[str, object] = {
    **_NEUTRAL,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "repetition_penalty": 1.0,
    "max_new_tokens": 16,
    "min_new_tokens": 0,
    "stop": [],
    "do_sample": True,
    "use_cache": True,
}
TRAINER_DEFAULTS: dict[str, object] = {**VLLM_DEFAULTS, "use_cache": None}


@dataclass
class SamplingFile:
    """A normalised sampling config: every compared field, and where each value came from."""

    path: Path
    format: str
    values: dict[str, Any]
    explicit: set[str] = field(default_factory=set)
    seed: int | None = 0
    detection: str = ""
    """How the format was chosen (configured, or which fields of the content decided it)."""
    not_compared: dict[str, object] = field(default_factory=dict)
    """Known fields present in the file that are not compared (value per field)."""
    eos_text: str | None = None
    """The side's EOS token as text: a stop string equal to it is the EOS stop."""
    eos_id: int | None = None
    raw_keys: set[str] = field(default_factory=set)
    """Every field name as written in the file."""
    default_sources: dict[str, str] = field(default_factory=dict)
    """Where a field the file does not state comes from (``dtype``: the config key)."""
    not_compared_reasons: dict[str, str] = field(default_factory=dict)
    """Why this file's fields are not compared, where the file's format says (a TRL config)."""

    def source(self, name: str) -> str:
        """Where ``name``'s value comes from: this file, or the setting that filled it in."""
        if name in self.explicit:
            return self.path.name
        if name == "eos_token_id":
            return self.default_sources.get(name, "the tokenizer's EOS")
        return self.default_sources.get(name, f"{self.format} default")

    def contradiction(self) -> str | None:
        """A configured format that the file's fields contradict (see format_contradiction)."""
        return format_contradiction(self)

    def not_compared_reason(self, name: str) -> str:
        """Why a known field is not compared."""
        return self.not_compared_reasons.get(name) or NOT_COMPARED.get(name, "not modelled")

    @property
    def compared_fields(self) -> tuple[str, ...]:
        """Every field ``sampling_config`` compares, in report order."""
        return COMPARED_FIELDS

    def spec(self) -> SamplingSpec:
        v = self.values
        return SamplingSpec(
            temperature=float(v["temperature"]),
            top_p=float(v["top_p"]),
            top_k=int(v["top_k"]),
            repetition_penalty=float(v["repetition_penalty"]),
            max_new_tokens=int(v["max_new_tokens"]),
            min_new_tokens=int(v["min_new_tokens"]),
            stop=list(v["stop"]),
            seed=self.seed,
            do_sample=bool(v["do_sample"]),
            min_p=float(v["min_p"]),
            eos_token_ids=list(v["eos_token_id"]),
            presence_penalty=float(v["presence_penalty"]),
            frequency_penalty=float(v["frequency_penalty"]),
            stop_token_ids=[int(t) for t in v["stop_token_ids"]],
            ignore_eos=bool(v["ignore_eos"]),
            transforms={name: value for name, value in self.off_policy().items()
                        if name not in COMPARED_FIELDS},
        )

    def off_policy(self) -> dict[str, object]:
        """This side's fields that move the sampled distribution away from the policy's
        softmax, with their values (see :data:`~paritygate.config.sampling_fields.
        OFF_POLICY`), compared fields first."""
        found: dict[str, object] = {}
        for name in OFF_POLICY:
            value = self.values.get(name) if name in COMPARED_FIELDS else next(
                (v for k, v in self.not_compared.items()
                 if _plain(k) == name), None)
            if not is_neutral(name, value):
                found[name] = value
        return found


def _plain(raw_key: str) -> str:
    """A listed field's gate name (a TRL ``generation_kwargs.<key>`` by its key)."""
    key = raw_key.removeprefix("generation_kwargs.")
    return ALIASES.get(key, key)


_RANGES = {
    "temperature": (0.0, math.inf),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, math.inf),
}
"""Valid ranges of the numeric sampling fields (outside them no engine samples)."""


def _normalise(key: str, value: Any, path: Path) -> object:
    try:
        if key in ("min_p", "presence_penalty", "frequency_penalty") and value is None:
            return 0.0
        if key in (
            "temperature", "top_p", "repetition_penalty", "min_p", "presence_penalty",
            "frequency_penalty",
        ):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError("must be finite")
            low, high = _RANGES.get(key, (-math.inf, math.inf))
            if not low <= number <= high:
                raise ValueError(f"must be in [{low:g}, {high:g}]")
            return number
        if key in ("stop_token_ids", "eos_token_id"):
            if value is None:
                return []
            return sorted(int(v) for v in ([value] if isinstance(value, int) else value))
        if key in ("top_k", "max_new_tokens", "min_new_tokens"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            n = int(value)
            least = 1 if key == "max_new_tokens" else 0
            if key != "top_k" and n < least:
                raise ValueError(f"must be >= {least}")
            if key != "top_k" and n > MAX_NEW_TOKENS:
                raise ValueError(f"must be <= {MAX_NEW_TOKENS} (MAX_NEW_TOKENS)")
            return 0 if key == "top_k" and n < 0 else n
        if key == "stop":
            if value is None:
                return []
            stops = [value] if isinstance(value, str) else [str(s) for s in value]
            if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
                raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings of at most "
                                 f"{MAX_STOP_CHARS} characters (MAX_STOP_STRINGS, MAX_STOP_CHARS)")
            return sorted(stops)
        if key in ("do_sample", "use_cache", "ignore_eos"):
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if key in ("padding_side", "truncation_side"):
            if value not in ("left", "right"):
                raise ValueError("expected 'left' or 'right'")
            return value
        if key == "dtype":
            aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
            return aliases.get(str(value), str(value))
    except (TypeError, ValueError) as exc:
        raise InputError(path, key, f"invalid value {value!r}: {exc}") from None
    return value


def detect_format(data: Mapping[str, object], *, trainer: bool, suffix: str) -> tuple[str, str]:
    """``(format, how it was detected)`` from the file's fields.

    A file with HF-only fields (``transformers_version``, ``do_sample``, ``max_new_tokens``...)
    is a ``generation_config``; one with vLLM-only fields (``max_tokens``, ``logprobs``...) is
    vLLM's; the trainer's side is the trainer format otherwise (neutral defaults). The file
    suffix decides only for a serving file whose fields name neither.
    """
    keys = set(data)
    hf, vllm = sorted(keys & HF_MARKERS), sorted(keys & VLLM_MARKERS)
    strong_hf = keys & {"transformers_version", "_from_model_config"}
    if trainer and not strong_hf:
        return "trainer", "trainer side (no transformers_version/_from_model_config field)"
    if hf and not vllm:
        return "hf_generation_config", f"detected from HF fields {hf[:3]}"
    if vllm and not hf:
        return "vllm", f"detected from vLLM fields {vllm[:3]}"
    if hf and vllm:
        fmt = "hf_generation_config" if strong_hf else "vllm"
        return fmt, f"fields of both formats ({hf[:2]} and {vllm[:2]}); read as {fmt}"
    fmt = "hf_generation_config" if suffix == ".json" else "vllm"
    return fmt, f"no format-specific field; read as {fmt} from the file suffix {suffix!r}"


def _known_hf_fields() -> set[str]:
    try:
        from transformers import GenerationConfig

        return set(GenerationConfig().__dict__)
    except ImportError:  # pragma: no cover - the lm extra brings transformers
        return set()


def _unknown(path: Path, raw_key: str, known: set[str]) -> InputError:
    import difflib

    close = difflib.get_close_matches(raw_key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return InputError(path, raw_key, f"unknown sampling field{hint}")


def load_sampling_file(
    path: Path,
    *,
    trainer: bool,
    side_defaults: Mapping[str, object],
    fmt: str = "auto",
    eos_text: str | None = None,
    eos_id: int | None = None,
    default_sources: dict[str, str] | None = None,
    strict: bool = False,
) -> SamplingFile:
    """Read one sampling config. ``side_defaults`` fills padding/truncation side and dtype
    from that side's tokenizer and model settings when the file does not state them.

    ``fmt`` is ``auto`` (detected from the content, see :func:`detect_format`) or one of
    ``trainer``, ``hf_generation_config``, ``vllm``, ``trl`` (a TRL trainer config, training
    side: :mod:`paritygate.families.causal_lm.trainer_config`; ``strict`` makes its
    unmappable fields an error). An unknown field is an :class:`InputError` naming it, in
    every format.
    """
    text = read_text(path, None, what="sampling config", max_bytes=MAX_CONFIG_BYTES,
                     bound="MAX_CONFIG_BYTES")
    data = (parse_json(text, path, None, what="sampling config") if path.suffix == ".json"
            else parse_yaml(text, path))
    data = data or {}
    if not isinstance(data, dict):
        raise InputError(path, None, "sampling config must be a mapping")
    import paritygate.families.causal_lm.trainer_config as trl

    if fmt == "trl" or (fmt == "auto" and trainer and trl.is_trl_config(data)):
        found = sorted(trl.TRL_MARKERS & set(data))[:3]
        how = "configured" if fmt == "trl" else f"TRL trainer config (fields {found})"
        return _load_trl(path, data, how, strict, side_defaults, eos_text, eos_id,
                         dict(default_sources or {}))
    if fmt == "auto":
        fmt, detection = detect_format(data, trainer=trainer, suffix=path.suffix)
    else:
        detection = "configured"
    defaults = {
        "hf_generation_config": HF_DEFAULTS, "trainer": TRAINER_DEFAULTS, "vllm": VLLM_DEFAULTS
    }[fmt]
    known = set(COMPARED_FIELDS) | IGNORED | set(NOT_COMPARED) | set(ALIASES)
    if fmt == "hf_generation_config" and not set(data) <= known:  # transformers only if needed
        known |= _known_hf_fields()
    values: dict[str, Any] = {
        **defaults, **side_defaults, "eos_token_id": [] if eos_id is None else [eos_id]
    }
    explicit: set[str] = set()
    not_compared: dict[str, object] = {}
    seed: int | None = 0
    for raw_key, raw_value in data.items():
        key = ALIASES.get(raw_key, raw_key)
        if key == "seed":
            if raw_value is not None and (
                isinstance(raw_value, bool) or not isinstance(raw_value, (int, str))
            ):
                raise InputError(path, raw_key, f"seed must be an integer (got {raw_value!r})")
            try:
                seed = None if raw_value is None else int(raw_value)
            except ValueError:
                raise InputError(
                    path, raw_key, f"seed must be an integer (got {raw_value!r})"
                ) from None
            continue
        if key in IGNORED:
            continue
        if key not in COMPARED_FIELDS:
            if key not in known:
                raise _unknown(path, raw_key, known)
            not_compared[raw_key] = raw_value
            continue
        values[key] = _normalise(key, raw_value, path)
        explicit.add(key)
    if fmt == "hf_generation_config" and values["temperature"] == 0.0:
        values["do_sample"] = False
    sources = dict(default_sources or {})
    if fmt == "hf_generation_config" and "eos_token_id" not in explicit:  # HF: no EOS stop
        values["eos_token_id"], sources["eos_token_id"] = [], NO_EOS.format(path.name)
    if fmt != "hf_generation_config" and "do_sample" not in explicit:
        values["do_sample"] = values["temperature"] > 0.0
    return SamplingFile(path, fmt, values, explicit, seed, detection, not_compared, eos_text,
                        eos_id, set(data), sources)


def _load_trl(
    path: Path,
    data: Mapping[str, object],
    detection: str,
    strict: bool,
    side_defaults: Mapping[str, object],
    eos_text: str | None,
    eos_id: int | None,
    sources: dict[str, str],
) -> SamplingFile:
    """A TRL trainer config as the training side (format ``trl``; see
    :mod:`paritygate.families.causal_lm.trainer_config` for the mapping)."""
    import paritygate.families.causal_lm.trainer_config as trl

    mapped, listed, reasons, notes = trl.map_trl_config(data, path, strict=strict)
    values: dict[str, Any] = {
        **TRAINER_DEFAULTS, **trl.TRL_DEFAULTS, **side_defaults,
        "eos_token_id": [] if eos_id is None else [eos_id],
    }
    for name in trl.TRL_DEFAULTS:
        sources.setdefault(name, "TRL's default")
    explicit: set[str] = set()
    for target, value in mapped.items():
        try:
            values[target] = _normalise(target, value, path)
        except InputError as exc:
            raw = next((k for k, v in trl.TRL_FIELDS.items() if v == target and k in data),
                       target)
            raise InputError(path, raw, exc.cause) from None
        explicit.add(target)
    if "do_sample" not in explicit:
        values["do_sample"] = values["temperature"] > 0.0
    if notes:
        detection = f"{detection}; mapped: {', '.join(notes)}"
    return SamplingFile(path, "trl", values, explicit, 0, detection, listed, eos_text, eos_id,
                        set(data), sources, reasons)


def format_contradiction(side: SamplingFile) -> str | None:
    """A configured format that the file's own fields contradict, or ``None``."""
    if side.detection != "configured":
        return None
    keys = set(side.raw_keys)
    strong = {
        "hf_generation_config": keys & {"transformers_version", "_from_model_config"},
        "vllm": keys & (VLLM_MARKERS - HF_MARKERS),
    }
    for fmt, found in strong.items():
        if found and fmt != side.format:
            return (
                f"{side.path.name} is read as {side.format} (configured) but its fields "
                f"{sorted(found)[:3]} are {fmt}'s: absent fields take {side.format}'s defaults"
            )
    return None
