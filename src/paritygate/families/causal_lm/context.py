"""The causal-LM family context: everything the LM checks share, loaded and validated once.

Building it reads the config's files (model directory, tokenizers, sampling
configs, probes) and raises :class:`~paritygate.errors.InputError` naming the
file and key of the first bad input. Models, engines and generations are loaded
lazily and memoised (``cached_property``, as the policy context does), so a gate that runs
one check pays only for that check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.engines.base import GenerationEngine
from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.engine_sampling import applied_by
from paritygate.families.causal_lm.probes import Probe
from paritygate.families.causal_lm.served_files import Contradiction
from paritygate.provenance import sha256_file

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from types import ModuleType

    from torch import Tensor

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.families.causal_lm.generations import Generations
    from paritygate.families.causal_lm.reference import ReferenceSetup
    from paritygate.families.causal_lm.reward import RewardSetup
    from paritygate.families.causal_lm.sampling import SamplingFile
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.families.causal_lm.weights import AdapterServed, WeightsDiff
    from paritygate.metrics.tiers import Limits
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.result import Measurement


@dataclass
class LMContext:
    """Loaded inputs of a causal-LM gate run (satisfies the family Context protocol)."""

    config: GateConfig
    spec: CausalLMSpec
    training: LMSide
    """What the trainer optimised: ``causal_lm.model_dir`` (and adapter), training tokenizer,
    sampling config and dtype."""
    serving: LMSide
    """What is served: the served directory (``causal_lm.serving.model_dir``, else the
    training directory), serving tokenizer, sampling config and dtype."""
    checkpoint_path: Path
    checkpoint_sha256: str
    probes: list[Probe]
    logprob_fn: Callable[..., Tensor]
    declared_dtype: tuple[str, str] | None = None
    """``(config key, dtype)`` when the config states the serving dtype: a deliberate
    precision change, judged by its precision tier rather than as a sampling difference."""
    family: str = "causal_lm"
    served_config_dtype: str | None = None
    """The dtype the served directory's ``config.json`` states (``None``: none)."""
    contradictions: list[Contradiction] = field(default_factory=list)
    """Declared serving files that differ from the served directory's own
    (:mod:`~paritygate.families.causal_lm.served_files`): ``sampling_config`` and
    ``tokenizer_parity`` record them."""
    cut_probes: list[str] = field(default_factory=list)
    """Ids of probes whose text was cut by characters before tokenizing (see
    :func:`~paritygate.families.causal_lm.tokenizer.cut_probe`)."""
    dump: DumpSummary | None = None
    """``engines: [dump]``: the dump, validated and counted when the context was built (its
    records are read again in batches by :meth:`.Generations.dump_batches`)."""
    kl_reference: ReferenceSetup | None = None
    """The validated ``causal_lm.reference`` block (``reference_parity``), ``None`` when absent."""
    reward: RewardSetup | None = None
    """The validated ``causal_lm.reward`` block (``reward_parity``), ``None`` when absent."""

    def note_probes(self, m: Measurement) -> None:
        """Name the probes whose text was cut before tokenizing, in a check's measurement."""
        if self.cut_probes:
            from paritygate.families.causal_lm.tokenizer import MAX_CHARS_PER_TOKEN

            limit = self.spec.max_prompt_tokens * MAX_CHARS_PER_TOKEN
            m.note(f"probe text cut to {limit} characters before tokenizing "
                   f"(max_prompt_tokens x {MAX_CHARS_PER_TOKEN}): {', '.join(self.cut_probes)}")

    @property
    def numerics(self) -> dict[str, str]:
        """Settings that move the numbers by design, recorded with a blessed baseline: a
        regression against a baseline blessed under other settings says so."""
        return {"serving dtype": self.spec.engine.dtype, "training dtype": self.spec.training.dtype}

    def served_limits(
        self, defaults: Mapping[str, float | None], user_set: Collection[str],
        names: Collection[str] | None = None,
    ) -> Limits:
        """A check's limits for the served copy (see :func:`.limits.served_limits`)."""
        from paritygate.families.causal_lm.limits import served_limits

        return served_limits(self.spec, self.declared_dtype, defaults, user_set, names)

    @cached_property
    def probes_sha256(self) -> str:
        """Digest of the probe prompts file."""
        return sha256_file(self.spec.probes)

    # -- weights -----------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Tensor]:
        """Every tensor of the training directory's safetensors files (read on each call, so
        the run does not hold a second copy of the weights). With an adapter, the base's
        files under their own names, each holding the merged model's tensor where it has one
        (the training policy the trainer optimised)."""
        from paritygate.families.causal_lm.weights import read_state

        state = read_state(self.training.model_dir)
        if self.training.adapter is not None:
            merged = self.training.model().state_dict()
            state.update({k: merged[k].detach() for k in state if k in merged})
        return state

    def adapter_base_state(self) -> dict[str, Tensor]:
        """The base model's tensors the adapter changes (its target weights), as stored in
        ``model_dir``; empty without an adapter."""
        from paritygate.families.causal_lm.weights import read_keys

        adapter = self.training.adapter
        if adapter is None:
            return {}
        return read_keys(self.training.model_dir, adapter.target_weights())

    def is_training_only(self, key: str) -> bool:
        """``key`` belongs to one of ``causal_lm.training_only_heads``."""
        from paritygate.families.causal_lm.weights import is_training_only

        return is_training_only(key, list(self.spec.training_only_heads))

    def adapter_served(self, training_state: Mapping[str, Tensor], differing: list[str],
                       ) -> AdapterServed | None:
        """How the served copy holds the declared adapter (:func:`.weights.how_served`)."""
        from paritygate.families.causal_lm.weights import how_served

        adapter = self.training.adapter
        if adapter is None or self.serves_training_files():
            return None
        return how_served(adapter, self.training.model_dir, self.adapter_base_state(),
                          training_state, self.serving_state(), differing)

    def serving_state(self) -> dict[str, Tensor]:
        """Every tensor of the served directory's safetensors files."""
        from paritygate.families.causal_lm.weights import read_state

        state = read_state(self.serving.model_dir)
        if self.serving.adapter is not None:
            merged = self.serving.model().state_dict()
            state.update({k: merged[k].detach() for k in state if k in merged})
        return state

    def serves_training_files(self) -> bool:
        """The served weights are the training side's own (no served directory configured, or
        the training directory named without an adapter): nothing to compare. A served
        directory naming the adapter's base itself is served as its files, the base alone."""
        if self.serving.adapter is not None:
            return False
        if self.serving.key == "causal_lm.model_dir":
            return True
        return (self.training.adapter is None
                and self.serving.model_dir.resolve() == self.training.model_dir.resolve())

    def serving_weights_diff(
        self, training_state: dict[str, Tensor] | None = None
    ) -> WeightsDiff:
        """Tensor-by-tensor comparison of the training and the served weights
        (:class:`paritygate.families.causal_lm.weights.WeightsDiff`)."""
        from paritygate.families.causal_lm.weights import compare_states, tied_groups

        train = self.checkpoint_state() if training_state is None else training_state
        serve = train if self.serves_training_files() else self.serving_state()
        tied = tied_groups(self.training.model()) if serve is not train else []
        return compare_states(train, serve, list(self.spec.training_only_heads), tied)

    # -- models ------------------------------------------------------------------
    def serves_training_model(self) -> bool:
        """The HF engine would load exactly the training model (same directory and dtype, one
        device): it then runs on the loaded training model instead of a second copy."""
        return (
            self.serves_training_files()
            and self.spec.engine.dtype == self.spec.training.dtype
            and self.spec.training.device_map is None
        )

    def close(self) -> None:
        """Shut down the engines this context started that hold processes (vLLM's engine
        core and its workers). Called when the run ends, so the shutdown happens while the
        streams vLLM's loggers write to are open, not in vLLM's exit-time finalizers (which
        log to a stream the test runner has closed: "--- Logging error ---" tracebacks)."""
        engine = self.__dict__.pop("_vllm_engine", None)
        close = getattr(engine, "close", None)
        if callable(close):
            close()

    def engine(self, name: str = "hf") -> GenerationEngine:
        """The inference engine ``name`` (``hf`` or ``vllm``), built once."""
        if name == "hf":
            return self._hf_engine
        if name == "vllm":
            return self._vllm_engine
        if name == "endpoint":
            return self._endpoint_engine
        raise ValueError(f"unknown engine {name!r}")

    @cached_property
    def _hf_engine(self) -> GenerationEngine:
        from paritygate.families.causal_lm.engines import hf_engine

        tok = self.serving.tokenizer
        if self.serves_training_model():
            return hf_engine(self.spec.engine, tok, model=self.training.model())
        if self.serving.adapter is not None:
            return hf_engine(self.spec.engine, tok, model=self.serving.model())
        with keyed(self.serving.key):
            return hf_engine(self.spec.engine, tok, model_dir=self.serving.model_dir,
                             trust_remote_code=self.config.trust_remote_code)

    @cached_property
    def _endpoint_engine(self) -> GenerationEngine:
        from paritygate.families.causal_lm.engines import endpoint_engine

        return endpoint_engine(self.spec)

    @cached_property
    def _vllm_engine(self) -> GenerationEngine:
        from paritygate.families.causal_lm.engines import vllm_engine

        tok_dir = self.spec.tokenizer.serving
        return vllm_engine(
            self.spec, self.vllm_model_dir(), self.serving.adapter,
            tokenizer_dir=tok_dir if tok_dir else None,
            seed=self.config.seed,
            max_new_tokens=self.serving.sampling.spec().max_new_tokens,
            trust_remote_code=self.config.trust_remote_code,
        )

    def vllm_model_dir(self) -> Path:
        """The directory vLLM serves: the engine's, or, when it holds keys under
        ``training_only_heads`` (a TRL value head), a temporary copy without them, as
        ``paritygate export`` writes it (vLLM refuses parameters its model class lacks)."""
        return self._vllm_model_dir

    @cached_property
    def _vllm_model_dir(self) -> Path:
        from paritygate.families.causal_lm.export import servable_copy
        from paritygate.families.causal_lm.inputs import BASE_SERVED

        if self.training.adapter is not None and self.serves_training_files():
            raise InputError(self.config.path, "causal_lm.serving.model_dir",
                             BASE_SERVED.format(what="vLLM"))

        return servable_copy(self.serving.model_dir, list(self.spec.training_only_heads))

    def serving_applied(self, engine: str) -> SamplingFile:
        """The serving sampling config as ``engine`` applies it (:mod:`.engine_sampling`)."""
        return applied_by(engine, self.serving.sampling)

    # -- generations ---------------------------------------------------------------
    @cached_property
    def generations(self) -> Generations:
        """The probes' greedy and sampled continuations and the training model's forwards
        over them, each computed once and shared by the checks."""
        from paritygate.families.causal_lm.generations import Generations

        return Generations(self.training, self.serving, self.engine, self.config.seed,
                           self.spec.generation_samples, self.logprob_fn,
                           self.spec.training.logprobs_mode, self._read_dump)

    def _read_dump(self) -> DumpSummary:
        from paritygate.families.causal_lm.inputs import read_lm_dump

        if self.dump is not None:
            return self.dump
        return read_lm_dump(self.config, self.spec, self.training.model_dir)

    def logprob_variants(self) -> ModuleType:
        """Reference log-prob helpers ``logprob_impl`` compares a trainer function with."""
        import paritygate.families.causal_lm.logprobs as helpers

        return helpers

    def precision_subject(self) -> PrecisionSubject:
        """The HF model in fp32 eval on the probe prompts (see :mod:`.precision`)."""
        from paritygate.families.causal_lm.precision import precision_subject

        return precision_subject(
            self.spec, name=self.config.name, model_dir=self.training.model_dir,
            prompts=self.training.prompts, pad_id=self.training.tokenizer.pad_token_id,
            streaming=self.config.precision.streaming,
            trust_remote_code=self.config.trust_remote_code,
            training=lambda: (self.training.model(), self.training.loading_info()))
