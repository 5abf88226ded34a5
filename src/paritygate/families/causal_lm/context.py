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
from typing import TYPE_CHECKING, Any

from paritygate.engines.base import GenerationEngine
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.hf_loading import load_causal_lm
from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.probes import Probe
from paritygate.families.causal_lm.sampling import SamplingFile
from paritygate.families.causal_lm.served_files import Contradiction
from paritygate.families.causal_lm.tokenizer import Tokenizer, encode_probe
from paritygate.provenance import sha256_file

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Mapping
    from types import ModuleType

    import numpy as np
    from torch import Tensor, nn

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.engines.rollout_dump import DumpRecord
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.reference import ReferenceSetup
    from paritygate.families.causal_lm.reward import RewardSetup
    from paritygate.families.causal_lm.weights import AdapterServed, WeightsDiff
    from paritygate.metrics.tiers import Limits
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.result import Measurement


@dataclass
class LMContext:
    """Loaded inputs of a causal-LM gate run (satisfies the family Context protocol)."""

    config: GateConfig
    spec: CausalLMSpec
    model_dir: Path
    engine_model_dir: Path
    checkpoint_path: Path
    checkpoint_sha256: str
    training_tokenizer: Tokenizer
    serving_tokenizer: Tokenizer
    probes: list[Probe]
    training_sampling: SamplingFile
    serving_sampling: SamplingFile
    logprob_fn: Callable[..., Tensor]
    declared_dtype: tuple[str, str] | None = None
    """``(config key, dtype)`` when the config states the serving dtype: a deliberate
    precision change, judged by its precision tier rather than as a sampling difference."""
    served_from: str = "causal_lm.model_dir"
    """The config key the served directory came from (``causal_lm.model_dir`` when no serving
    directory is configured: the training directory is served)."""
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
    records are read again in batches by :meth:`dump_batches`)."""
    kl_reference: ReferenceSetup | None = None
    """The validated ``causal_lm.reference`` block (``reference_parity``), ``None`` when absent."""
    reward: RewardSetup | None = None
    """The validated ``causal_lm.reward`` block (``reward_parity``), ``None`` when absent."""
    adapter: AdapterInfo | None = None
    """The PEFT adapter merged into ``model_dir`` (the base) as the training side, ``None``
    when the training directory is a full model."""
    adapter_key: str = "causal_lm.adapter"
    """The config key that named the adapter (``causal_lm.model_dir`` when it is the
    adapter's directory)."""
    serving_adapter: AdapterInfo | None = None
    """``causal_lm.serving.adapter``: the PEFT adapter served on the served base (vLLM LoRA;
    merged in memory for the HF engine and ``weights_load``)."""

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

        state = read_state(self.model_dir)
        if self.adapter is not None:
            merged = self.reference_model().state_dict()
            state.update({k: merged[k].detach() for k in state if k in merged})
        return state

    def adapter_base_state(self) -> dict[str, Tensor]:
        """The base model's tensors the adapter changes (its target weights), as stored in
        ``model_dir``; empty without an adapter."""
        from paritygate.families.causal_lm.weights import read_keys

        if self.adapter is None:
            return {}
        return read_keys(self.model_dir, self.adapter.target_weights())

    def is_training_only(self, key: str) -> bool:
        """``key`` belongs to one of ``causal_lm.training_only_heads``."""
        from paritygate.families.causal_lm.weights import is_training_only

        return is_training_only(key, list(self.spec.training_only_heads))

    def adapter_served(self, training_state: Mapping[str, Tensor], differing: list[str],
                       ) -> AdapterServed | None:
        """How the served copy holds the declared adapter (:func:`.weights.how_served`)."""
        from paritygate.families.causal_lm.weights import how_served

        if self.adapter is None or self.serves_training_files():
            return None
        return how_served(self.adapter, self.model_dir, self.adapter_base_state(),
                          training_state, self.serving_state(), differing)

    def serving_state(self) -> dict[str, Tensor]:
        """Every tensor of the served directory's safetensors files."""
        from paritygate.families.causal_lm.weights import read_state

        state = read_state(self.engine_model_dir)
        if self.serving_adapter is not None:
            merged = self._served_merged.state_dict()
            state.update({k: merged[k].detach() for k in state if k in merged})
        return state

    def serves_training_files(self) -> bool:
        """The served weights are the training side's own (no served directory configured, or
        the training directory named without an adapter): nothing to compare. A served
        directory naming the adapter's base itself is served as its files, the base alone."""
        if self.serving_adapter is not None:
            return False
        if self.served_from == "causal_lm.model_dir":
            return True
        return self.adapter is None and self.engine_model_dir.resolve() == self.model_dir.resolve()

    @cached_property
    def _served_merged(self) -> nn.Module:
        """The served base with ``serving.adapter`` merged (peft, in memory), serving dtype."""
        from paritygate.families.causal_lm.adapter import merge_adapter

        assert self.serving_adapter is not None
        with keyed(self.served_from):
            model, _ = load_causal_lm(self.engine_model_dir, self.spec.engine.dtype,
                                      trust_remote_code=self.config.trust_remote_code)
        return merge_adapter(model, self.serving_adapter, "causal_lm.serving.adapter")

    def serving_weights_diff(
        self, training_state: dict[str, Tensor] | None = None
    ) -> WeightsDiff:
        """Tensor-by-tensor comparison of the training and the served weights
        (:class:`paritygate.families.causal_lm.weights.WeightsDiff`)."""
        from paritygate.families.causal_lm.weights import compare_states, tied_groups

        train = self.checkpoint_state() if training_state is None else training_state
        serve = train if self.serves_training_files() else self.serving_state()
        tied = tied_groups(self.reference_model()) if serve is not train else []
        return compare_states(train, serve, list(self.spec.training_only_heads), tied)

    # -- models ------------------------------------------------------------------
    @cached_property
    def _reference(self) -> tuple[nn.Module, dict[str, Any]]:
        with keyed("causal_lm.model_dir"):
            model, info = self._load(self.model_dir)
        if self.adapter is not None:
            from paritygate.families.causal_lm.adapter import merge_adapter

            model = merge_adapter(model, self.adapter, self.adapter_key)
        return model, info

    def _load(self, model_dir: Path) -> tuple[nn.Module, dict[str, Any]]:
        return load_causal_lm(
            model_dir,
            self.spec.training.dtype,
            trust_remote_code=self.config.trust_remote_code,
            device_map=self.spec.training.device_map,
        )

    def reference_model(self) -> nn.Module:
        """The training-side model (training dtype, eval mode), value head not attached."""
        return self._reference[0].eval()

    def reference_loading_info(self) -> dict[str, Any]:
        return self._reference[1]

    def teacher_forced(self, generation: Generation) -> list[np.ndarray]:
        """The training model's logits over each row of ``generation`` (one batched forward,
        no cache, computed once per generation): row ``i`` is ``(len(output_i) + 1, V)``,
        the next-token logits at the last prompt position, each generated token and after the
        last one. ``logits_agreement``, ``generation_parity`` and ``logprob_delta`` share it."""
        from paritygate.families.causal_lm.recompute import teacher_forced_rows

        done = self._teacher_forced
        for seen, rows in done:
            if seen is generation:
                return rows
        pad = self.training_tokenizer.pad_token_id
        rows = teacher_forced_rows(self.reference_model(), generation, 0 if pad is None else pad)
        done.append((generation, rows))
        return rows

    def teacher_forced_once(self, generation: Generation) -> list[np.ndarray]:
        """:meth:`teacher_forced` without keeping the rows: a dump's audit forces one bounded
        batch at a time and drops it."""
        from paritygate.families.causal_lm.recompute import teacher_forced_rows

        pad = self.training_tokenizer.pad_token_id
        return teacher_forced_rows(self.reference_model(), generation, 0 if pad is None else pad)

    @cached_property
    def _teacher_forced(self) -> list[tuple[Generation, list[np.ndarray]]]:
        """``(generation, rows)`` of every generation teacher-forced so far (by identity)."""
        return []

    def serves_reference(self) -> bool:
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

        if self.serves_reference():
            return hf_engine(self.spec.engine, self.serving_tokenizer, model=self.reference_model())
        if self.serving_adapter is not None:
            return hf_engine(self.spec.engine, self.serving_tokenizer, model=self._served_merged)
        with keyed(self.served_from):
            return hf_engine(self.spec.engine, self.serving_tokenizer,
                             model_dir=self.engine_model_dir,
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
            self.spec, self.vllm_model_dir(), self.serving_adapter,
            tokenizer_dir=tok_dir if tok_dir else None,
            seed=self.config.seed,
            max_new_tokens=self.serving_sampling.spec().max_new_tokens,
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

        if self.adapter is not None and self.serves_training_files():
            raise InputError(self.config.path, "causal_lm.serving.model_dir",
                             BASE_SERVED.format(what="vLLM"))

        return servable_copy(self.engine_model_dir, list(self.spec.training_only_heads))

    # -- prompts and generations ------------------------------------------------
    def prompts(self, side: str = "serving") -> list[list[int]]:
        """Probe prompts as token ids, encoded by the ``serving`` or ``training`` tokenizer."""
        return self._serving_prompts if side == "serving" else self._training_prompts

    @cached_property
    def _serving_prompts(self) -> list[list[int]]:
        return self._encode(self.serving_tokenizer)

    @cached_property
    def _training_prompts(self) -> list[list[int]]:
        return self._encode(self.training_tokenizer)

    def _encode(self, tok: Tokenizer) -> list[list[int]]:
        return [encode_probe(tok, p, self.spec.max_prompt_tokens) for p in self.probes]

    def render_probe(self, side: str, probe: Probe) -> str:
        """The prompt text of ``probe`` after the ``side`` tokenizer's chat template."""
        from paritygate.families.causal_lm.tokenizer import render_probe

        tok = self.serving_tokenizer if side == "serving" else self.training_tokenizer
        return render_probe(tok, probe, self.spec.max_prompt_tokens)

    def dump_summary(self) -> DumpSummary:
        """The validated dump of ``engine.dump`` (``engines: [dump]``): its parts' counts."""
        if self.dump is None:
            from paritygate.families.causal_lm.inputs import read_lm_dump

            self.dump = read_lm_dump(self.config, self.spec, self.model_dir)
        return self.dump

    def dump_records(self) -> list[DumpRecord]:
        """Every record of ``engine.dump`` in memory (``routing_agreement``'s one pass)."""
        from paritygate.engines.rollout_dump import read_dump
        dump = self.dump_summary()
        return read_dump(dump.path, vocab_size=dump.vocab_size, num_experts=dump.num_experts)

    def dump_batches(self, greedy: bool) -> Iterator[Generation]:
        """The dump's greedy (or sampled) records as generations of a bounded batch, in file
        order: a dump's audit holds one batch at a time, whatever the dump's size."""
        from paritygate.engines.dump_audit import dump_batches

        return dump_batches(self.dump_summary(), greedy=greedy)

    def sampled(self, engine: str = "hf") -> tuple[Generation, SamplingSpec]:
        """Sampled continuations (``generation_samples`` per probe) under the serving config
        (a dump's records stream instead: :meth:`dump_batches`)."""
        if engine not in self._samples:
            self._samples[engine] = self._sample(engine)  # an unknown engine: engine() says so
        return self._samples[engine]

    @cached_property
    def _samples(self) -> dict[str, tuple[Generation, SamplingSpec]]:
        """Each engine's sampled generation, memoised (the checks share it)."""
        return {}

    @cached_property
    def _greedies(self) -> dict[str, Generation]:
        """Each engine's greedy generation, memoised (the checks share it)."""
        return {}

    def _sample(self, engine: str) -> tuple[Generation, SamplingSpec]:
        sampling = self.serving_sampling.spec()
        if sampling.seed is None:
            sampling = SamplingSpec(**{**sampling.as_dict(), "seed": self.config.seed})
        prompts = [p for p in self.prompts() for _ in range(self.spec.generation_samples)]
        return self.engine(engine).generate(prompts, sampling), sampling

    def greedy(self, engine: str = "hf") -> Generation:
        """Greedy continuations of every probe under the serving config's length and stops
        (a dump's records stream instead: :meth:`dump_batches`)."""
        if engine not in self._greedies:
            self._greedies[engine] = self._greedy(engine)
        return self._greedies[engine]

    def _greedy(self, engine: str) -> Generation:
        sampling = self.serving_sampling.spec().greedy()
        extra = {"keep_logits": True} if engine == "hf" else {}  # logits_agreement's
        return self.engine(engine).generate(self.prompts(), sampling, **extra)

    def logprob_variants(self) -> ModuleType:
        """Reference log-prob helpers ``logprob_impl`` compares a trainer function with."""
        import paritygate.families.causal_lm.logprobs as helpers

        return helpers

    def vllm_served_rows(self) -> tuple[np.ndarray, np.ndarray, list[str]] | str:
        """vLLM's prompt log-probs in the trainer's gauge, or why not (:mod:`.served_logprobs`)."""
        from paritygate.families.causal_lm.served_logprobs import vllm_rows
        return vllm_rows(self.greedy("vllm"), self.teacher_forced, self.engine("vllm"),
                         [p.id for p in self.probes])

    def recompute(self, generation: Generation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The trainer's log-probs of every generated token: ``(logp_train, logp_infer, mask)``."""
        from paritygate.families.causal_lm.recompute import recompute

        return recompute(self.reference_model(), self.logprob_fn, generation,
                         sampling=self.training_sampling.spec(),
                         mode=self.spec.training.logprobs_mode,
                         pad_id=self.training_tokenizer.pad_token_id)

    def precision_subject(self) -> PrecisionSubject:
        """The HF model in fp32 eval on the probe prompts (see :mod:`.precision`)."""
        from paritygate.families.causal_lm.precision import precision_subject

        return precision_subject(
            self.spec, name=self.config.name, model_dir=self.model_dir,
            prompts=self.prompts("training"), pad_id=self.training_tokenizer.pad_token_id,
            streaming=self.config.precision.streaming,
            trust_remote_code=self.config.trust_remote_code,
            reference=lambda: (self.reference_model(), self.reference_loading_info()))
