"""Sampling configs: read the trainer's and the server's, normalise, and diff them field by field.

Three formats are read: an HF ``generation_config.json`` (absent fields take HF's
defaults, e.g. ``top_k: 50`` and greedy decoding), a vLLM sampling-parameters YAML
(absent fields take vLLM's defaults, ``max_tokens: 16``, no top-k) and the
trainer's YAML (HF or vLLM names, absent fields take the neutral defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from paritygate.engines.generation import SamplingSpec
from paritygate.errors import InputError

COMPARED_FIELDS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "do_sample",
    "padding_side",
    "truncation_side",
    "use_cache",
    "dtype",
)
ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "stop_strings": "stop"}
IGNORED = {
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
    "seed",
    "n",
    "logprobs",
    "prompt_logprobs",
    "num_return_sequences",
}
"""Token ids (tokenizer_parity compares them), bookkeeping, and per-request settings."""

HF_DEFAULTS: dict[str, Any] = {
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
VLLM_DEFAULTS: dict[str, Any] = {
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
TRAINER_DEFAULTS: dict[str, Any] = {**VLLM_DEFAULTS, "use_cache": None}


@dataclass
class SamplingFile:
    """A normalised sampling config: every compared field, and where each value came from."""

    path: Path
    format: str
    values: dict[str, Any]
    explicit: set[str] = field(default_factory=set)
    seed: int | None = 0

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
        )


def _normalise(key: str, value: Any, path: Path) -> Any:
    try:
        if key in ("temperature", "top_p", "repetition_penalty"):
            return float(value)
        if key in ("top_k", "max_new_tokens", "min_new_tokens"):
            n = int(value)
            return 0 if key == "top_k" and n < 0 else n
        if key == "stop":
            if value is None:
                return []
            return [value] if isinstance(value, str) else sorted(str(s) for s in value)
        if key in ("do_sample", "use_cache"):
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


def load_sampling_file(path: Path, *, trainer: bool, side_defaults: dict[str, Any]) -> SamplingFile:
    """Read one sampling config. ``side_defaults`` fills padding/truncation side and dtype
    from that side's tokenizer and model settings when the file does not state them."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, None, "sampling config not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read sampling config: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InputError(path, None, f"unparseable sampling config: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise InputError(path, None, "sampling config must be a mapping")
    if path.suffix == ".json":
        fmt, defaults = "hf_generation_config", HF_DEFAULTS
    elif trainer:
        fmt, defaults = "trainer", TRAINER_DEFAULTS
    else:
        fmt, defaults = "vllm", VLLM_DEFAULTS
    values: dict[str, Any] = {**defaults, **side_defaults}
    explicit: set[str] = set()
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
        if key in IGNORED or (fmt == "hf_generation_config" and key not in COMPARED_FIELDS):
            continue
        if key not in COMPARED_FIELDS:
            raise InputError(
                path, raw_key, f"unknown sampling field; known: {', '.join(COMPARED_FIELDS)}"
            )
        values[key] = _normalise(key, raw_value, path)
        explicit.add(key)
    if fmt == "hf_generation_config" and values["temperature"] == 0.0:
        values["do_sample"] = False
    if fmt != "hf_generation_config" and "do_sample" not in explicit:
        values["do_sample"] = values["temperature"] > 0.0
    return SamplingFile(path, fmt, values, explicit, seed)
