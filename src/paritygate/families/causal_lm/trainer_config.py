"""The trainer's own config as the training sampling source: a TRL config YAML.

``trl grpo --config grpo.yaml`` (and ``rloo``) reads one YAML holding the trainer's
arguments (``GRPOConfig``), the script's (dataset) and the model's (``ModelConfig``). Its
sampling protocol is a handful of those fields; :data:`TRL_FIELDS` maps each onto the gate's
field, ``generation_kwargs`` is merged over them (it is what TRL passes on to the generation
config or vLLM ``SamplingParams``, so it wins), and every other field is sorted into a named
group: training options (not sampling), the trainer's vLLM engine settings, and fields that
change what is sampled but that the gate cannot map. Nothing is dropped silently: every field
not mapped is listed in ``sampling_config``'s report with its group; with
``sampling.strict: true`` the unmappable ones are bad input (exit 2, naming them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from paritygate.errors import InputError

TRL_FIELDS: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_completion_length": "max_new_tokens",
}
"""TRL config field -> the gate's sampling field."""

TRL_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_new_tokens": 512,
}
"""TRL's defaults (GRPOConfig, TRL 1.x) for the mapped fields a file leaves out:
``top_k: 0`` and ``min_p: None`` mean disabled, ``max_completion_length: 512``."""

GENERATION_KWARGS: dict[str, str] = {
    **{name: name for name in (
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids",
        "eos_token_id", "ignore_eos", "do_sample", "use_cache")},
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "stop_strings": "stop",
}
"""``generation_kwargs`` keys (HF ``GenerationConfig`` or vLLM ``SamplingParams`` names) the
gate maps; the rest of its keys are listed as unmappable."""

UNMAPPABLE: dict[str, str] = {
    "vllm_structured_outputs_regex": "constrains vLLM's sampled tokens to a regex (guided "
    "decoding); the gate does not model it",
    "chat_template_kwargs": "arguments of the chat template: compare templates with "
    "tokenizer_parity",
}
"""Top-level fields that change what is sampled but that no gate field expresses."""

VLLM_PREFIX = "vllm_"
TRL_MARKERS = frozenset({
    "max_completion_length", "num_generations", "generation_kwargs", "use_vllm", "vllm_mode",
    "output_dir", "learning_rate", "per_device_train_batch_size", "model_name_or_path",
    "beta", "loss_type", "gradient_accumulation_steps", "dataset_name",
})
"""Fields that only a trainer's config has: a training sampling file with one is TRL's."""

ENGINE_EXTRAS = frozenset({"use_vllm"})


def is_trl_config(data: Mapping[str, object]) -> bool:
    """Whether a training-side sampling file is a TRL config (see :data:`TRL_MARKERS`)."""
    return bool(TRL_MARKERS & set(data))


def _known_trl_fields() -> set[str] | None:
    """Every field ``trl <command> --config`` accepts (GRPO/RLOO trainer, script, model
    arguments), or ``None`` without TRL installed."""
    try:
        import dataclasses

        import trl
        from trl.scripts.utils import ScriptArguments
    except ImportError:
        return None
    names = {"env"}  # TrlParser sets environment variables from an ``env:`` mapping
    for name in ("GRPOConfig", "RLOOConfig", "ModelConfig", "DatasetMixtureConfig"):
        cls = getattr(trl, name, None)
        if cls is not None and dataclasses.is_dataclass(cls):
            names |= {f.name for f in dataclasses.fields(cls)}
    names |= {f.name for f in dataclasses.fields(ScriptArguments)}
    return names


def map_trl_config(
    data: Mapping[str, object], path: Path, *, strict: bool = False
) -> tuple[dict[str, object], dict[str, object], dict[str, str], list[str]]:
    """``(mapped, listed, reasons, notes)`` for one TRL config.

    ``mapped`` holds gate field -> raw value (TRL's defaults for mapped fields the file
    leaves out are the caller's defaults); ``listed`` every field not mapped (raw name ->
    value; ``generation_kwargs.<key>`` for its keys) with its ``reasons``; ``notes`` say
    how each mapped field was mapped. Raises :class:`InputError` naming the field for an
    unknown field (a typo: every TRL field is known when TRL is installed), a
    ``generation_kwargs`` that is not a mapping, and, when ``strict``, the unmappable fields.
    """
    known = _known_trl_fields()
    mapped: dict[str, object] = {}
    listed: dict[str, object] = {}
    reasons: dict[str, str] = {}
    notes: list[str] = []
    unmappable: list[str] = []
    # generation_kwargs last, whatever the file's order: it overrides the top-level fields.
    ordered = sorted(data.items(), key=lambda item: item[0] == "generation_kwargs")
    for key, value in ordered:
        if key in TRL_FIELDS:
            target = TRL_FIELDS[key]
            if key == "top_k" and value is None:
                value = 0  # disabled (0 and -1 are normalised to 0 too; min_p None to 0.0)
            mapped[target] = value
            if target != key:
                notes.append(f"{key} -> {target}")
        elif key == "generation_kwargs":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise InputError(path, key, f"expected a mapping (got {value!r})")
            for sub, sub_value in value.items():
                if sub in GENERATION_KWARGS:
                    target = GENERATION_KWARGS[sub]
                    if target == "top_k" and sub_value is None:
                        sub_value = 0
                    mapped[target] = sub_value
                    notes.append(f"generation_kwargs.{sub} -> {target} (overrides)")
                else:
                    name = f"generation_kwargs.{sub}"
                    listed[name] = sub_value
                    reasons[name] = "generation option the gate cannot map"
                    unmappable.append(name)
        elif key in UNMAPPABLE:
            if value in (None, {}, ""):
                continue
            listed[key] = value
            reasons[key] = UNMAPPABLE[key]
            unmappable.append(key)
        elif key.startswith(VLLM_PREFIX) or key in ENGINE_EXTRAS:
            listed[key] = value
            reasons[key] = "the trainer's vLLM engine setting (not a sampling parameter)"
        elif known is not None and key not in known:
            import difflib

            close = difflib.get_close_matches(key, sorted(known | set(TRL_FIELDS)), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(path, key, f"unknown TRL config field{hint}")
        else:
            listed[key] = value
            reasons[key] = ("training option (not sampling)" if known is not None
                            else "not a sampling field (TRL not installed to check the name)")
    if strict and unmappable:
        raise InputError(path, unmappable[0],
                         f"cannot map to the gate's sampling fields: {', '.join(unmappable)} "
                         "(sampling.strict: true; false lists them in the report instead)")
    return mapped, listed, reasons, notes

