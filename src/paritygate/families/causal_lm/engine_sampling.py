"""What each serving engine applies from the serving sampling config: one function per engine.

A served ``generation_config.json`` means different things to different engines. HF
``generate`` reads every field, absent ones taking HF's defaults (``top_k: 50``, greedy unless
``do_sample``). vLLM (``LLM`` and ``vllm serve``, ``--generation-config auto``, the default)
reads the served directory's file through ``ModelConfig.get_diff_sampling_param``: it takes
only ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``,
``presence_penalty``, ``frequency_penalty`` and ``max_new_tokens`` (as ``max_tokens``), each
only where the file states it with a value other than transformers' own ``GenerationConfig``
default (transformers 5 has no defaults there: every stated field counts), and its EOS ids
(to stop). Every other field takes vLLM's neutral default: no top-k where the file leaves it
out, ``do_sample`` ignored (vLLM samples unless the temperature is 0), no minimum length, no
stop strings. :func:`applied_by` maps the serving file to what an engine applies, so
``sampling_config`` compares what the engine really samples with, and the vLLM and endpoint
engines sample with it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paritygate.families.causal_lm.sampling import SamplingFile

VLLM_TAKES: tuple[str, ...] = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                               "presence_penalty", "frequency_penalty", "max_new_tokens")
"""The sampling fields vLLM 0.32 takes from a generation_config.json (gate names)."""

KEPT: tuple[str, ...] = ("eos_token_id", "padding_side", "truncation_side", "dtype",
                         "use_cache")
"""Fields that are no sampling parameter: read from the same file (EOS ids) or set by the
side's tokenizer and model, whatever the engine."""

ENGINES_READING_VLLM = frozenset({"vllm", "endpoint"})
"""Engines whose server reads a generation_config.json as vLLM does (``endpoint``: an
OpenAI-compatible vLLM server)."""


HF_GENERATION_DEFAULTS: dict[int, dict[str, object]] = {
    4: {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None,
        "repetition_penalty": 1.0, "presence_penalty": None, "frequency_penalty": None,
        "max_new_tokens": None},
    5: dict.fromkeys(VLLM_TAKES),
}
"""transformers' own ``GenerationConfig`` defaults of the fields vLLM takes, by transformers'
major version (``None`` where it has none: transformers 5 leaves every sampling field unset,
and 4 has no presence or frequency penalty). A test holds the installed version's row to the
real ``GenerationConfig``."""


@functools.cache
def _hf_defaults() -> dict[str, object]:
    """The ``GenerationConfig`` defaults of the installed transformers (its version read from
    the package's metadata, so a config-only run imports no transformers), which vLLM's
    ``to_diff_dict`` drops. Without transformers installed (a remote endpoint), the newest
    row."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        major = max(HF_GENERATION_DEFAULTS)
    return HF_GENERATION_DEFAULTS[min(max(major, min(HF_GENERATION_DEFAULTS)),
                                      max(HF_GENERATION_DEFAULTS))]


def vllm_applies(side: SamplingFile) -> SamplingFile:
    """The sampling vLLM applies when it serves ``side`` (an HF ``generation_config.json``)
    as its default sampling parameters; any other format is sent as request values."""
    from paritygate.families.causal_lm.sampling import COMPARED_FIELDS, VLLM_DEFAULTS

    if side.format != "hf_generation_config":
        return side
    values = {name: (side.values.get(name) if name in KEPT else VLLM_DEFAULTS.get(name))
              for name in COMPARED_FIELDS}
    explicit = {name for name in side.explicit if name in KEPT}
    sources = dict(side.default_sources)
    for name in VLLM_TAKES:
        raw = side.values.get(name)
        if name in side.explicit and raw is not None and raw != _hf_defaults()[name]:
            values[name] = raw
            explicit.add(name)
        else:
            sources[name] = ("vLLM's default (vLLM takes only the stated, non-default "
                             "sampling fields of generation_config.json)")
    values["do_sample"] = float(str(values["temperature"] or 0.0)) > 0.0
    if "eos_token_id" not in side.explicit:  # vLLM stops on the tokenizer's EOS regardless
        values["eos_token_id"] = [] if side.eos_id is None else [side.eos_id]
        sources.pop("eos_token_id", None)
    for name in ("do_sample", "min_new_tokens", "stop", "ignore_eos", "stop_token_ids"):
        sources[name] = f"vLLM's default (vLLM does not read {name} from generation_config.json)"
    return dataclasses.replace(side, values=values, explicit=explicit, default_sources=sources,
                               detection=f"{side.detection}; as vLLM applies it")


def applied_by(engine: str, side: SamplingFile) -> SamplingFile:
    """What ``engine`` applies from the serving sampling config ``side``: vLLM's reading of
    a generation_config.json for ``vllm`` and ``endpoint``, the file as read (HF semantics
    for a generation_config.json) for ``hf`` and a dump (whose records carry their own)."""
    return vllm_applies(side) if engine in ENGINES_READING_VLLM else side
