"""Validation of a causal-LM gate's inputs that the context's builder runs once.

Each helper takes the config, the family spec and the paths it reads (never the context) and
raises :class:`~paritygate.errors.InputError` naming the file and key of a bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.probes import Probe
from paritygate.families.causal_lm.sampling import SamplingFile, load_sampling_file
from paritygate.families.causal_lm.served_files import Contradiction
from paritygate.families.causal_lm.tokenizer import encode_probe, load_tokenizer

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.tokenizer import Tokenizer

BASE_SERVED = (
    "the training side is a base model plus causal_lm.adapter, merged in memory; {what} would "
    "serve the base without the adapter: set causal_lm.serving.model_dir to the merged copy "
    "that ships")


def check_adapter_served(config: GateConfig, spec: CausalLMSpec) -> None:
    """With an adapter and no served directory, only the HF engine on the merged training
    model itself serves the adapter (same dtype, one device); another dtype or vLLM would load
    the base directory alone, so that is bad input, not a silent base-vs-merged comparison."""
    if spec.engine.dtype != spec.training.dtype or spec.training.device_map is not None:
        raise InputError(config.path, "causal_lm.serving.model_dir", BASE_SERVED.format(
            what=f"the HF engine in {spec.engine.dtype}"))
    if "vllm" in spec.engines:
        raise InputError(config.path, "causal_lm.serving.model_dir",
                         BASE_SERVED.format(what="vLLM"))


def resolve_adapter(config: GateConfig, spec: CausalLMSpec,
                     ) -> tuple[CausalLMSpec, AdapterInfo | None, str]:
    """The spec with ``model_dir`` the base model, the adapter read and validated (``None``
    without one), and the key that named it. ``model_dir`` naming an adapter directory takes
    its base from ``adapter_config.json`` when that is a local directory."""
    from paritygate.families.causal_lm.adapter import is_adapter_dir, local_base, read_adapter

    if spec.adapter is not None:
        key = "causal_lm.adapter"
        return spec, read_adapter(spec.adapter, key), key
    model_dir = spec.model_dir
    if (model_dir / "config.json").is_file() or not is_adapter_dir(model_dir):
        return spec, None, "causal_lm.adapter"
    key = "causal_lm.model_dir"
    adapter = read_adapter(model_dir, key)
    base = local_base(adapter)
    if base is None:
        named = f"the hub id {adapter.base_name!r}" if adapter.base_name else "no base"
        raise InputError(
            model_dir / "adapter_config.json", key,
            f"a PEFT adapter directory whose base_model_name_or_path is {named}, which the gate "
            "cannot fetch: set causal_lm.model_dir to the base model's local copy and "
            f"causal_lm.adapter to {model_dir}")
    update = {"model_dir": base, "adapter": model_dir}
    return spec.model_copy(update=update), adapter, key


def read_lm_dump(config: GateConfig, spec: CausalLMSpec, model_dir: Path) -> DumpSummary:
    """``causal_lm.engine.dump`` validated in one streaming pass and counted, token ids checked
    against the training model's ``vocab_size`` and routed expert ids against its experts; a bad
    record is bad input naming the line and field."""
    from paritygate.engines.dump_audit import summarise_dump
    from paritygate.engines.hf_loading import config_num_experts, config_vocab_size

    if not spec.engine.dump:
        raise InputError(config.path, "causal_lm.engine.dump", "engines: [dump] needs a dump file")
    with keyed("causal_lm.engine.dump"):
        summary = summarise_dump(spec.engine.dump,
                                 vocab_size=config_vocab_size(model_dir),
                                 num_experts=config_num_experts(model_dir))
    missing = summary.routed.first_missing
    from paritygate.sections.routing_agreement import RoutingSpec

    routing = RoutingSpec.of(spec)
    if routing is not None and routing.dump_experts and missing is not None:
        raise InputError(spec.engine.dump, f"{missing}: routed_experts",
                         "required field missing (causal_lm.routing.dump_experts: true)")
    return summary


def scan_behaviour_dumps(config: GateConfig, spec: CausalLMSpec, model_dir: Path) -> None:
    """Every record of ``behaviour.training_dump`` / ``serving_dump`` read once and checked
    (schema, token ids below the model's ``vocab_size``), one batch held at a time, before
    any tokenizer or model loads: a bad last line is refused in seconds."""
    from paritygate.engines.dump_stream import expand, stream_draws
    from paritygate.engines.hf_loading import config_vocab_size
    from paritygate.sections.behaviour_parity import BehaviourSpec

    block = BehaviourSpec.of(spec)
    if block is None:
        return
    vocab = config_vocab_size(model_dir)
    for side, dump in (("training", block.training_dump), ("serving", block.serving_dump)):
        if dump is None:
            continue
        key = f"causal_lm.behaviour.{side}_dump"
        with keyed(key):
            for _ in stream_draws(expand(dump, config.path.parent, key),
                                  batch=block.batch_size, vocab_size=vocab):
                pass


def served_dir_contradictions(
    config: GateConfig, spec: CausalLMSpec, sources: dict[str, str], served_dir: Path,
    serving_sampling: SamplingFile, serving_tok: Tokenizer, probes: list[Probe],
) -> list[Contradiction]:
    """Declared serving files that differ from the served directory's own (see
    :mod:`~paritygate.families.causal_lm.served_files`)."""
    from paritygate.families.causal_lm.served_files import (
        chat_template_contradiction,
        has_tokenizer,
        tokenizer_fields,
    )

    found: list[Contradiction | None] = []
    declared_tok = spec.tokenizer.serving if spec.tokenizer.serving else None
    if ("tokenizer" in sources and declared_tok is not None
            and declared_tok.resolve() != served_dir.resolve() and has_tokenizer(served_dir)):
        with keyed(sources["tokenizer"]):
            own_tok = load_tokenizer(served_dir, trust_remote_code=config.trust_remote_code)
        fields = tokenizer_fields(
            serving_tok, own_tok,
            lambda tok: [encode_probe(tok, p, spec.max_prompt_tokens) for p in probes])
        if spec.tokenizer.serving_chat_template and "chat_template" in fields:
            fields.remove("chat_template")  # the override is judged on its own below
        if fields:
            found.append(Contradiction("tokenizer", sources["tokenizer"], declared_tok,
                                       served_dir, tuple(fields)))
    if spec.tokenizer.serving_chat_template:
        found.append(chat_template_contradiction(
            spec.tokenizer.serving_chat_template,
            "causal_lm.tokenizer.serving_chat_template", served_dir))
    found.extend(sampling_contradictions(sources, served_dir, serving_sampling, serving_tok))
    return [c for c in found if c is not None]


def sampling_contradictions(
    sources: dict[str, str], served_dir: Path, serving_sampling: SamplingFile,
    serving_tok: Tokenizer,
) -> list[Contradiction]:
    """The declared serving sampling file against the served directory's own
    ``generation_config.json`` (none when either is absent)."""
    from paritygate.families.causal_lm.served_files import sampling_contradiction

    own = served_dir / "generation_config.json"
    if "sampling" not in sources or not own.is_file():
        return []
    with keyed(sources["sampling"]):
        own_file = load_sampling_file(
            own, trainer=False, fmt="hf_generation_config",
            eos_text=serving_tok.eos_token, eos_id=serving_tok.eos_token_id,
            side_defaults={k: serving_sampling.values.get(k)
                           for k in ("padding_side", "truncation_side", "dtype")},
        )
    found = sampling_contradiction(serving_sampling, own_file, sources["sampling"])
    return [] if found is None else [found]


def encode_checked(
    config: GateConfig, side: str, tok: Tokenizer, probe: Probe, model_dir: Path
) -> list[int]:
    """``probe``'s token ids with the ``side`` tokenizer, its rendered chat checked too; a
    chat template's failure names the template's file, its config key and the probe."""
    from paritygate.families.causal_lm.tokenizer import render_probe, template_file

    spec = config.causal_lm
    assert spec is not None
    try:
        ids = encode_probe(tok, probe, spec.max_prompt_tokens)
        if probe.is_chat:
            render_probe(tok, probe, spec.max_prompt_tokens)
    except InputError as exc:
        if exc.file is not None:
            raise
        directory = getattr(spec.tokenizer, side)
        override = getattr(spec.tokenizer, f"{side}_chat_template")
        where = template_file(directory if directory else model_dir,
                              override if override else None)
        key = (f"causal_lm.tokenizer.{side}_chat_template" if override
               else f"causal_lm.tokenizer.{side}")
        raise InputError(where, f"{key}: {exc.key}", exc.cause) from None
    return ids
