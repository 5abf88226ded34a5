"""Building the causal-LM context: validate the config's inputs once, then compose them.

Reads the model directories, tokenizers, probes, sampling configs and the trainer's
log-prob function in that order and raises :class:`~paritygate.errors.InputError` naming
the file and key of the first bad input. Models and engines load lazily in the context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from paritygate.engines.hf_loading import check_model_dir, safetensors_files
from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.context import LMContext
from paritygate.families.causal_lm.inputs import (
    check_adapter_served,
    encode_checked,
    read_lm_dump,
    resolve_adapter,
    scan_behaviour_dumps,
    served_dir_contradictions,
)
from paritygate.families.causal_lm.logprobs import TrainerLogprobs
from paritygate.families.causal_lm.probes import Probe, load_probes
from paritygate.families.causal_lm.sampling import SamplingFile, load_sampling_file
from paritygate.families.causal_lm.served_files import served_dtype
from paritygate.families.causal_lm.serving import resolve_serving
from paritygate.families.causal_lm.sides import LMSide
from paritygate.families.causal_lm.tokenizer import Tokenizer, is_cut, load_tokenizer
from paritygate.imports import guard_user_code, import_callable
from paritygate.provenance import sha256_files
from paritygate.reading import check_input

if TYPE_CHECKING:
    from torch import Tensor

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.behaviour_sides import BehaviourSetup
    from paritygate.families.causal_lm.engines import Engines
    from paritygate.families.causal_lm.generations import Generations
    from paritygate.families.causal_lm.served_weights import WeightsSetup

SIDES = ("training", "serving")
"""The config's names of the two sides (``causal_lm.tokenizer.<side>``, ``sampling.<side>``)."""


@dataclass(frozen=True)
class _Dirs:
    """The validated training and serving model directories and the checkpoint files."""

    training: Path
    serving: Path
    files: list[Path]
    trained: list[Path]
    serving_adapter: AdapterInfo | None


def build_lm_context(config: GateConfig) -> LMContext:
    """Validate and load the inputs of a causal-LM gate; raises InputError naming file and key."""
    spec = config.causal_lm
    if spec is None:
        raise InputError(config.path, "causal_lm", "family causal_lm needs a causal_lm section")
    spec, adapter, adapter_key = resolve_adapter(config, spec)
    if "endpoint" in [*spec.engines, spec.serving.engine] and spec.endpoint is None:
        raise InputError(config.path, "causal_lm.endpoint",
                         "engines: [endpoint] needs an endpoint block (base_url, model)")
    spec, served_from, sources = resolve_serving(config, spec)
    declared = (sources["dtype"], spec.engine.dtype) if "dtype" in sources else None
    training_dir = _training_dir(config, spec)
    # A dump is validated first: its size and records need only config.json's vocab_size,
    # so a bad dump is refused in a second, before tokenizers and models load.
    dump = read_lm_dump(config, spec, training_dir) if "dump" in spec.engines else None
    scan_behaviour_dumps(config, spec, training_dir)
    dirs = _model_dirs(config, spec, training_dir, adapter, adapter_key, served_from)
    toks = {side: _tokenizer(config, spec, side, dirs.training) for side in SIDES}
    with keyed("causal_lm.probes"):
        probes = load_probes(spec.probes)
    _check_probes(config, spec, probes, toks, dirs.training)
    sampling = sampling_files(config, spec, toks, declared)
    contradictions = served_dir_contradictions(
        config, spec, sources, dirs.serving, sampling["serving"], toks["serving"], probes)
    logprobs = TrainerLogprobs(_logprob_fn(config, spec), spec.training.logprob_fn,
                               spec.training.logprobs_mode)
    read_dump = ((lambda: dump) if dump is not None
                 else partial(read_lm_dump, config, spec, dirs.training))
    from paritygate.families.causal_lm.reference import load_reference
    from paritygate.families.causal_lm.reward import load_reward

    kl_reference = load_reference(config, spec, dirs.training, toks["training"])
    reward = load_reward(config, spec, probes, toks["training"])
    _check_callables(config, spec)
    files = dirs.files
    training, serving = make_sides(config, spec, toks, sampling, (dirs.training, dirs.serving),
                                   served_from, tuple(probes), (adapter, adapter_key),
                                   dirs.serving_adapter)
    made = setups(config, spec, training, serving, logprobs, read_dump)
    return LMContext(
        config=config, spec=spec, training=training, serving=serving, logprobs=logprobs,
        engines=made.engines, generations=made.generations, weights=made.weights,
        behaviour=made.behaviour,
        checkpoint_path=(adapter.directory if adapter is not None
                         else files[0] if len(files) == 1 else dirs.training),
        checkpoint_sha256=sha256_files(dirs.trained),
        probes=probes,
        cut_probes=[p.id for p in probes if is_cut(p, spec.max_prompt_tokens)],
        declared_dtype=declared,
        contradictions=contradictions,
        served_config_dtype=served_dtype(dirs.serving),
        kl_reference=kl_reference,
        reward=reward,
    )


class Setups(NamedTuple):
    """The setups the context holds beside the sides (each loads what it needs on first use)."""

    engines: Engines
    generations: Generations
    weights: WeightsSetup
    behaviour: BehaviourSetup | None


def setups(config: GateConfig, spec: CausalLMSpec, training: LMSide, serving: LMSide,
           logprobs: TrainerLogprobs, read_dump: Callable[[], DumpSummary]) -> Setups:
    """The serving engines, the shared generations, the weights and behaviour_parity's setup,
    built from the two sides."""
    from paritygate.families.causal_lm.behaviour_sides import behaviour_setup
    from paritygate.families.causal_lm.engines import Engines
    from paritygate.families.causal_lm.generations import Generations
    from paritygate.families.causal_lm.served_weights import WeightsSetup

    engines = Engines(training, serving, spec, config.seed, config.path)
    return Setups(
        engines,
        Generations(training, serving, engines, config.seed, spec.generation_samples,
                    logprobs, read_dump),
        WeightsSetup(training, serving, tuple(spec.training_only_heads)),
        behaviour_setup(spec, training, serving, engines, config.seed, config.path),
    )


def _training_dir(config: GateConfig, spec: CausalLMSpec) -> Path:
    """``causal_lm.model_dir``, checked to be a directory holding ``config.json``."""
    model_dir = spec.model_dir
    if not model_dir.is_dir():
        raise InputError(config.path, "causal_lm.model_dir",
                         f"model directory not found: {model_dir}")
    check_input(model_dir, "causal_lm.model_dir", what="model directory", expect="dir")
    if not (model_dir / "config.json").is_file():
        raise InputError(
            model_dir / "config.json", "causal_lm.model_dir", "model directory has no config.json"
        )
    return model_dir


def trained_files(weights: list[Path], adapter: AdapterInfo | None) -> list[Path]:
    """The files a trained checkpoint is (its digest's input): the model directory's
    safetensors ``weights``, plus the adapter's config and weights when one is trained."""
    if adapter is None:
        return list(weights)
    from paritygate.families.causal_lm.adapter import CONFIG_FILE, WEIGHTS_FILE

    return [*weights, adapter.directory / CONFIG_FILE, adapter.directory / WEIGHTS_FILE]


def _model_dirs(
    config: GateConfig, spec: CausalLMSpec, model_dir: Path, adapter: AdapterInfo | None,
    adapter_key: str, served_from: str,
) -> _Dirs:
    """The training directory's weights (and adapter) checked, then the served one's."""
    trust = config.trust_remote_code
    with keyed("causal_lm.model_dir"):
        files = safetensors_files(model_dir)
        check_model_dir(model_dir, trust_remote_code=trust)
    if adapter is not None:
        from paritygate.families.causal_lm.adapter import check_fits

        check_fits(adapter, model_dir, adapter_key)
    trained = trained_files(files, adapter)
    engine_dir = spec.engine.model_dir if spec.engine.model_dir else model_dir
    if engine_dir.is_dir():  # a FIFO or device in it is named before config.json is looked for
        check_input(engine_dir, served_from, what="model directory", expect="dir")
    if not (engine_dir / "config.json").is_file():
        raise InputError(config.path, served_from, f"no HF model directory at {engine_dir}")
    if engine_dir != model_dir:
        with keyed(served_from):
            check_model_dir(engine_dir, trust_remote_code=trust)
    serving_adapter = None
    if spec.serving.adapter is not None:
        from paritygate.families.causal_lm.adapter import check_fits, read_adapter

        serving_adapter = read_adapter(spec.serving.adapter,
                                       "causal_lm.serving.adapter")
        check_fits(serving_adapter, engine_dir, "causal_lm.serving.adapter")
    elif served_from == "causal_lm.model_dir" and adapter is not None:
        check_adapter_served(config, spec)
    return _Dirs(model_dir, engine_dir, files, trained, serving_adapter)


def _tokenizer(config: GateConfig, spec: CausalLMSpec, side: str, model_dir: Path) -> Tokenizer:
    """The ``side`` tokenizer (its directory, else the model's) with its template override."""
    directory = getattr(spec.tokenizer, side)
    template = getattr(spec.tokenizer, f"{side}_chat_template")
    with keyed(f"causal_lm.tokenizer.{side}"):
        return load_tokenizer(
            directory if directory else model_dir,
            template if template else None,
            trust_remote_code=config.trust_remote_code,
        )


def _check_probes(
    config: GateConfig, spec: CausalLMSpec, probes: list[Probe], toks: dict[str, Tokenizer],
    model_dir: Path,
) -> None:
    """Every probe goes through both tokenizers (and chat templates) here, once, so a
    template that fails or runs away is bad input before any check runs."""
    for probe in probes:
        for side in SIDES:
            if probe.is_chat and not getattr(toks[side], "chat_template", None):
                raise InputError(
                    config.path,
                    f"causal_lm.tokenizer.{side}",
                    f"probe {probe.id!r} is a chat but the {side} tokenizer has no chat template",
                )
        encoded = [encode_checked(config, side, toks[side], probe, model_dir) for side in SIDES]
        # An empty prompt is a fair edge case while a BOS token conditions it; with no token on
        # either side nothing can be generated (one side empty is tokenizer_parity's finding).
        if not any(encoded):
            raise InputError(
                spec.probes,
                f"probe {probe.id!r}",
                "encodes to no tokens with either tokenizer (empty text, no BOS): "
                "nothing to condition on",
            )


def sampling_files(config: GateConfig, spec: CausalLMSpec, toks: dict[str, Tokenizer],
                   declared: tuple[str, str] | None) -> dict[str, SamplingFile]:
    """The training and serving sampling configs, each defaulted from its side's tokenizer and
    dtype (the serving dtype's source: the key that declares it, else the engine default)."""
    dtype_source = declared[0] if declared else "causal_lm.engine.dtype (default)"
    return {"training": _sampling_file(config, spec, "training", toks["training"],
                                       spec.training.dtype, "causal_lm.training.dtype",
                                       trainer=True),
            "serving": _sampling_file(config, spec, "serving", toks["serving"],
                                      spec.engine.dtype, dtype_source, trainer=False)}


def make_sides(
    config: GateConfig, spec: CausalLMSpec, toks: dict[str, Tokenizer],
    sampling: dict[str, SamplingFile], dirs: tuple[Path, Path], served_from: str,
    probes: tuple[Probe, ...], adapter: tuple[AdapterInfo | None, str],
    serving_adapter: AdapterInfo | None = None,
) -> tuple[LMSide, LMSide]:
    """The training and serving sides over the training and served directories ``dirs``;
    ``adapter`` is the training adapter and its config key."""
    trust = config.trust_remote_code
    training = LMSide(name="training", model_dir=dirs[0],
                      key="causal_lm.model_dir", tokenizer=toks["training"],
                      sampling=sampling["training"], dtype=spec.training.dtype, probes=probes,
                      max_prompt_tokens=spec.max_prompt_tokens, adapter=adapter[0],
                      adapter_key=adapter[1], trust_remote_code=trust,
                      device_map=spec.training.device_map)
    serving = LMSide(name="serving", model_dir=dirs[1], key=served_from,
                     tokenizer=toks["serving"], sampling=sampling["serving"],
                     dtype=spec.engine.dtype, probes=probes,
                     max_prompt_tokens=spec.max_prompt_tokens, adapter=serving_adapter,
                     adapter_key="causal_lm.serving.adapter", trust_remote_code=trust)
    return training, serving


def _sampling_file(
    config: GateConfig, spec: CausalLMSpec, side: str, tok: Tokenizer, dtype: str,
    dtype_source: str, *, trainer: bool,
) -> SamplingFile:
    """The ``side`` sampling config, its unset fields defaulted from the side's tokenizer."""
    with keyed(f"causal_lm.sampling.{side}"):
        return load_sampling_file(
            config.resolve(getattr(spec.sampling, side)),
            trainer=trainer,
            fmt=getattr(spec.sampling, f"{side}_format"),
            strict=spec.sampling.strict,
            eos_text=tok.eos_token,
            eos_id=tok.eos_token_id,
            side_defaults={
                "padding_side": tok.padding_side,
                "truncation_side": tok.truncation_side,
                "dtype": dtype,
            },
            default_sources={
                "padding_side": f"the {side} tokenizer",
                "truncation_side": f"the {side} tokenizer",
                "dtype": dtype_source,
            },
        )


def _logprob_fn(config: GateConfig, spec: CausalLMSpec) -> Callable[..., Tensor]:
    """``causal_lm.training.logprob_fn`` imported, as a model-level function, guarded."""
    from paritygate.families.causal_lm.logprobs import as_model_level

    fn_key = "causal_lm.training.logprob_fn"
    fn: Callable[..., Tensor] = guard_user_code(
        as_model_level(
            import_callable(spec.training.logprob_fn, config.path, fn_key),
            spec.training.logprob_convention,
        ),
        config.path,
        fn_key,
    )
    return fn


def _check_callables(config: GateConfig, spec: CausalLMSpec) -> None:
    """A bad ``module:callable`` name is bad input before any check runs."""
    if spec.engine.collate:
        import_callable(spec.engine.collate, config.path, "causal_lm.engine.collate")
    from paritygate.sections.behaviour_parity import BehaviourSpec

    behaviour = BehaviourSpec.of(spec)
    if behaviour is not None and behaviour.reward_fn:
        import_callable(behaviour.reward_fn, config.path, "causal_lm.behaviour.reward_fn")
