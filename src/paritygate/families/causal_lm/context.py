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
from paritygate.engines.hf_loading import check_model_dir, load_causal_lm, safetensors_files
from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.probes import Probe, load_probes
from paritygate.families.causal_lm.sampling import SamplingFile, load_sampling_file
from paritygate.families.causal_lm.served_files import Contradiction, served_dtype
from paritygate.families.causal_lm.serving import resolve_serving
from paritygate.families.causal_lm.tokenizer import encode_probe, is_cut, load_tokenizer
from paritygate.imports import guard_user_code, import_callable
from paritygate.provenance import sha256_file, sha256_files
from paritygate.reading import check_input

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from paritygate.config import GateConfig
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.config import CausalLMSpec
    from paritygate.families.causal_lm.reference import ReferenceSetup
    from paritygate.families.causal_lm.reward import RewardSetup
    from paritygate.metrics.tiers import Limits
    from paritygate.precision.subject import PrecisionSubject


@dataclass
class LMContext:
    """Loaded inputs of a causal-LM gate run (satisfies the family Context protocol)."""

    config: GateConfig
    spec: CausalLMSpec
    model_dir: Path
    engine_model_dir: Path
    checkpoint_path: Path
    checkpoint_sha256: str
    training_tokenizer: Any
    serving_tokenizer: Any
    probes: list[Probe]
    training_sampling: SamplingFile
    serving_sampling: SamplingFile
    logprob_fn: Any
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
    dump: list[dict[str, Any]] | None = None
    """``engines: [dump]``: the dump's records, validated when the context was built."""
    kl_reference: ReferenceSetup | None = None
    """The validated ``causal_lm.reference`` block (``reference_parity``), ``None`` when absent."""
    reward: RewardSetup | None = None
    """The validated ``causal_lm.reward`` block (``reward_parity``), ``None`` when absent."""
    adapter: AdapterInfo | None = None
    """The PEFT adapter merged into ``model_dir`` (the base) as the training side, ``None``
    when the training directory is a full model."""
    adapter_key: str = "causal_lm.adapter"
    serving_adapter: AdapterInfo | None = None
    """``causal_lm.serving.adapter``: the PEFT adapter served on the served base (vLLM LoRA;
    merged in memory for the HF engine and ``weights_load``)."""
    """The config key that named the adapter (``causal_lm.model_dir`` when it is the
    adapter's directory)."""

    def note_probes(self, m: Any) -> None:
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
        """A check's limits for the served copy: the user's values where the config sets
        them, else the tier of the declared precision (``precision_tier``, else training dtype
        against serving dtype), else the fp32 defaults
        (:func:`paritygate.metrics.tiers.judged_limits`, one rule for every LM check)."""
        from paritygate.metrics.tiers import judged_limits, resolve_tier

        spec = self.spec
        try:
            tier = resolve_tier(spec.precision_tier, spec.training.dtype, spec.engine.dtype)
        except ValueError:
            tier = None  # no tier for this pair: the fp32 defaults (or the config's) apply
        if spec.precision_tier:
            by = f"causal_lm.precision_tier {spec.precision_tier}"
        else:
            source = self.declared_dtype[0] if self.declared_dtype else "causal_lm.engine.dtype"
            by = (f"training {spec.training.dtype}, serving {spec.engine.dtype} from "
                  f"{source}")
        return judged_limits(tier, defaults, user_set, names=names, declared_by=by)

    @cached_property
    def probes_sha256(self) -> str:
        """Digest of the probe prompts file."""
        return sha256_file(self.config.resolve(self.spec.probes))

    # -- weights -----------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
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

    def adapter_base_state(self) -> dict[str, Any]:
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

    def served_adapter_fit(self, training_state: Mapping[str, Any], differing: list[str]) -> Any:
        """How the served copy merged the declared adapter
        (:class:`~paritygate.families.causal_lm.weights.AdapterFit`; ``None`` without an
        adapter, or when a tensor outside its targets differs too)."""
        from paritygate.families.causal_lm.weights import adapter_fit

        base = self.adapter_base_state()
        if not base:
            return None
        served = training_state if self.serves_training_files() else self.serving_state()
        return adapter_fit(base, {k: training_state[k] for k in base if k in training_state},
                           {k: served[k] for k in base if k in served}, differing)

    def serving_state(self) -> dict[str, Any]:
        """Every tensor of the served directory's safetensors files."""
        from paritygate.families.causal_lm.weights import read_state

        state = read_state(self.engine_model_dir)
        if self.serving_adapter is not None:
            merged = self._served_merged.state_dict()
            state.update({k: merged[k].detach() for k in state if k in merged})
        return state

    def serves_training_files(self) -> bool:
        """The served weights are the training side's own (same directory, no adapter served
        on it): nothing to compare tensor by tensor."""
        return self.engine_model_dir == self.model_dir and self.serving_adapter is None

    @cached_property
    def _served_merged(self) -> Any:
        """The served base with ``serving.adapter`` merged (peft, in memory), serving dtype."""
        from paritygate.families.causal_lm.adapter import merge_adapter

        assert self.serving_adapter is not None
        with keyed(self.served_from):
            model, _ = load_causal_lm(self.engine_model_dir, self.spec.engine.dtype,
                                      trust_remote_code=self.config.trust_remote_code)
        return merge_adapter(model, self.serving_adapter, "causal_lm.serving.adapter")

    def serving_weights_diff(self, training_state: dict[str, Any] | None = None) -> Any:
        """Tensor-by-tensor comparison of the training and the served weights
        (:class:`paritygate.families.causal_lm.weights.WeightsDiff`)."""
        from paritygate.families.causal_lm.weights import compare_states, tied_groups

        train = self.checkpoint_state() if training_state is None else training_state
        serve = train if self.serves_training_files() else self.serving_state()
        tied = tied_groups(self.reference_model()) if serve is not train else []
        return compare_states(train, serve, list(self.spec.training_only_heads), tied)

    # -- models ------------------------------------------------------------------
    @cached_property
    def _reference(self) -> tuple[Any, dict[str, Any]]:
        with keyed("causal_lm.model_dir"):
            model, info = self._load(self.model_dir)
        if self.adapter is not None:
            from paritygate.families.causal_lm.adapter import merge_adapter

            model = merge_adapter(model, self.adapter, self.adapter_key)
        return model, info

    def _load(self, model_dir: Path) -> tuple[Any, dict[str, Any]]:
        return load_causal_lm(
            model_dir,
            self.spec.training.dtype,
            trust_remote_code=self.config.trust_remote_code,
            device_map=self.spec.training.device_map,
        )

    def reference_model(self) -> Any:
        """The training-side model (training dtype, eval mode), value head not attached."""
        return self._reference[0].eval()

    def reference_loading_info(self) -> dict[str, Any]:
        return self._reference[1]

    def teacher_forced(self, generation: Generation) -> list[Any]:
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

    @cached_property
    def _teacher_forced(self) -> list[tuple[Generation, list[Any]]]:
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
        raise ValueError(f"unknown engine {name!r}")

    @cached_property
    def _hf_engine(self) -> GenerationEngine:
        from paritygate.engines.hf_generate import HFGenerateEngine

        eng = self.spec.engine
        options = {
            "logprobs_mode": eng.logprobs_mode,
            "top_logprobs": eng.top_logprobs,
            "batch_size": eng.batch_size,
        }
        if self.serves_reference():
            return HFGenerateEngine.for_tokenizer(
                self.reference_model(), self.serving_tokenizer, **options
            )
        if self.serving_adapter is not None:
            return HFGenerateEngine.for_tokenizer(
                self._served_merged, self.serving_tokenizer, **options)
        with keyed(self.served_from):
            return HFGenerateEngine.from_dir(
                self.engine_model_dir,
                self.serving_tokenizer,
                dtype=eng.dtype,
                trust_remote_code=self.config.trust_remote_code,
                **options,
            )

    @cached_property
    def _vllm_engine(self) -> GenerationEngine:
        from paritygate.engines.vllm_engine import VLLMEngine

        eng = self.spec.engine
        tok_dir = self.spec.tokenizer.serving
        lora = self.serving_adapter
        return VLLMEngine(
            self.vllm_model_dir(),
            lora_dir=lora.directory if lora is not None else None,
            max_lora_rank=max(lora.ranks()) if lora is not None and lora.ranks() else None,
            tokenizer_dir=self.config.resolve(tok_dir) if tok_dir else None,
            dtype=eng.dtype,
            seed=self.config.seed,
            logprobs_mode=eng.logprobs_mode,
            top_logprobs=eng.top_logprobs,
            gpu_memory_utilization=eng.gpu_memory_utilization,
            tensor_parallel_size=eng.tensor_parallel_size,
            max_model_len=self.spec.max_prompt_tokens
            + self.serving_sampling.spec().max_new_tokens,
            engine_kwargs={"trust_remote_code": self.config.trust_remote_code},
        )

    def vllm_model_dir(self) -> Path:
        """The directory vLLM serves: the engine's, or, when it holds keys under
        ``training_only_heads`` (a TRL value head), a temporary copy without them, as
        ``paritygate export`` writes it (vLLM refuses parameters its model class lacks)."""
        return self._vllm_model_dir

    @cached_property
    def _vllm_model_dir(self) -> Path:
        from paritygate.families.causal_lm.export import servable_copy

        if self.adapter is not None and self.serves_training_files():
            raise InputError(self.config.path, "causal_lm.serving.model_dir",
                             _BASE_SERVED.format(what="vLLM"))

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

    def _encode(self, tok: Any) -> list[list[int]]:
        return [encode_probe(tok, p, self.spec.max_prompt_tokens) for p in self.probes]

    def render_probe(self, side: str, probe: Probe) -> str:
        """The prompt text of ``probe`` after the ``side`` tokenizer's chat template."""
        from paritygate.families.causal_lm.tokenizer import render_probe

        tok = self.serving_tokenizer if side == "serving" else self.training_tokenizer
        return render_probe(tok, probe, self.spec.max_prompt_tokens)

    def dump_records(self) -> list[dict[str, Any]]:
        """The validated records of ``engine.dump`` (``engines: [dump]``)."""
        return self._dump_records

    @cached_property
    def _dump_records(self) -> list[dict[str, Any]]:
        if self.dump is not None:
            return self.dump
        return read_lm_dump(self.config, self.spec, self.model_dir)

    def _dump_generation(self, greedy: bool) -> tuple[Generation | None, SamplingSpec | None]:
        from paritygate.engines.rollout_dump import as_generation, is_greedy

        records = [r for r in self.dump_records() if is_greedy(r["sampling"]) == greedy]
        if not records:
            return None, None
        return as_generation(records), records[0]["sampling"]

    def sampled(self, engine: str = "hf") -> tuple[Generation, SamplingSpec]:
        """Sampled continuations (``generation_samples`` per probe) under the serving config;
        for ``dump`` the dump's sampled (non-greedy) records and their sampling params."""
        if engine == "hf":
            return self._sampled_hf
        if engine == "vllm":
            return self._sampled_vllm
        if engine == "dump":
            return self._sampled_dump
        return self._sample(engine)  # an unknown engine: engine() says so

    @cached_property
    def _sampled_hf(self) -> tuple[Generation, SamplingSpec]:
        return self._sample("hf")

    @cached_property
    def _sampled_vllm(self) -> tuple[Generation, SamplingSpec]:
        return self._sample("vllm")

    @cached_property
    def _sampled_dump(self) -> tuple[Generation, SamplingSpec]:
        generation, sampling = self._dump_generation(greedy=False)
        if generation is None or sampling is None:
            raise InputError(
                self.config.resolve(self.spec.engine.dump or ""), None,
                "the dump holds no sampled record (all are greedy)",
            )
        return generation, sampling

    def _sample(self, engine: str) -> tuple[Generation, SamplingSpec]:
        sampling = self.serving_sampling.spec()
        if sampling.seed is None:
            sampling = SamplingSpec(**{**sampling.as_dict(), "seed": self.config.seed})
        prompts = [p for p in self.prompts() for _ in range(self.spec.generation_samples)]
        return self.engine(engine).generate(prompts, sampling), sampling

    def greedy(self, engine: str = "hf") -> Generation | None:
        """Greedy continuations of every probe under the serving config's length and stops
        (``dump``: the dump's greedy records, ``None`` when it has none)."""
        if engine == "hf":
            return self._greedy_hf
        if engine == "vllm":
            return self._greedy_vllm
        if engine == "dump":
            return self._greedy_dump
        return self._greedy(engine)

    @cached_property
    def _greedy_hf(self) -> Generation:
        return self._greedy("hf")

    @cached_property
    def _greedy_vllm(self) -> Generation:
        return self._greedy("vllm")

    @cached_property
    def _greedy_dump(self) -> Generation | None:
        return self._dump_generation(greedy=True)[0]

    def _greedy(self, engine: str) -> Generation:
        sampling = self.serving_sampling.spec().greedy()
        extra = {"keep_logits": True} if engine == "hf" else {}  # logits_agreement's
        return self.engine(engine).generate(self.prompts(), sampling, **extra)

    def logprob_variants(self) -> Any:
        """Reference log-prob helpers ``logprob_impl`` compares a trainer function with."""
        import paritygate.families.causal_lm.logprobs as helpers

        return helpers

    def recompute(self, generation: Generation) -> tuple[Any, Any, Any]:
        """The trainer's log-probs of every generated token: ``(logp_train, logp_infer, mask)``."""
        from paritygate.families.causal_lm.recompute import recompute

        return recompute(self, generation)

    def precision_subject(self) -> PrecisionSubject:
        """The HF model in fp32 eval on the probe prompts (see :mod:`.precision`)."""
        from paritygate.families.causal_lm.precision import precision_subject

        return precision_subject(self)


def build_lm_context(config: GateConfig) -> LMContext:
    """Validate and load the inputs of a causal-LM gate; raises InputError naming file and key."""
    spec = config.causal_lm
    if spec is None:
        raise InputError(config.path, "causal_lm", "family causal_lm needs a causal_lm section")
    cfg = config.path
    spec, adapter, adapter_key = _resolve_adapter(config, spec)
    spec, served_from, sources = resolve_serving(config, spec)
    declared = (sources["dtype"], spec.engine.dtype) if "dtype" in sources else None
    model_dir = config.resolve(spec.model_dir)
    if not model_dir.is_dir():
        raise InputError(cfg, "causal_lm.model_dir", f"model directory not found: {model_dir}")
    check_input(model_dir, "causal_lm.model_dir", what="model directory", expect="dir")
    if not (model_dir / "config.json").is_file():
        raise InputError(
            model_dir / "config.json", "causal_lm.model_dir", "model directory has no config.json"
        )
    # A dump is validated first: its size and records need only config.json's vocab_size,
    # so a bad dump is refused in a second, before tokenizers and models load.
    dump = read_lm_dump(config, spec, model_dir) if "dump" in spec.engines else None
    trust = config.trust_remote_code
    with keyed("causal_lm.model_dir"):
        files = safetensors_files(model_dir)
        check_model_dir(model_dir, trust_remote_code=trust)
    trained = files
    if adapter is not None:
        from paritygate.families.causal_lm.adapter import CONFIG_FILE, WEIGHTS_FILE, check_fits

        check_fits(adapter, model_dir, adapter_key)

        trained = [*files, adapter.directory / CONFIG_FILE, adapter.directory / WEIGHTS_FILE]
    engine_dir = config.resolve(spec.engine.model_dir) if spec.engine.model_dir else model_dir
    if engine_dir.is_dir():  # a FIFO or device in it is named before config.json is looked for
        check_input(engine_dir, served_from, what="model directory", expect="dir")
    if not (engine_dir / "config.json").is_file():
        raise InputError(cfg, served_from, f"no HF model directory at {engine_dir}")
    if engine_dir != model_dir:
        with keyed(served_from):
            check_model_dir(engine_dir, trust_remote_code=trust)
    serving_adapter = None
    if spec.serving.adapter is not None:
        from paritygate.families.causal_lm.adapter import check_fits, read_adapter

        serving_adapter = read_adapter(config.resolve(spec.serving.adapter),
                                       "causal_lm.serving.adapter")
        check_fits(serving_adapter, engine_dir, "causal_lm.serving.adapter")
    elif engine_dir == model_dir and adapter is not None:
        _check_adapter_served(config, spec)

    def tokenizer(side: str) -> Any:
        tspec = spec.tokenizer
        directory = getattr(tspec, side)
        template = getattr(tspec, f"{side}_chat_template")
        with keyed(f"causal_lm.tokenizer.{side}"):
            return load_tokenizer(
                config.resolve(directory) if directory else model_dir,
                config.resolve(template) if template else None,
                trust_remote_code=config.trust_remote_code,
            )

    training_tok = tokenizer("training")
    serving_tok = tokenizer("serving")
    with keyed("causal_lm.probes"):
        probes = load_probes(config.resolve(spec.probes))
    for probe in probes:
        for side, tok in (("training", training_tok), ("serving", serving_tok)):
            if probe.is_chat and not getattr(tok, "chat_template", None):
                raise InputError(
                    cfg,
                    f"causal_lm.tokenizer.{side}",
                    f"probe {probe.id!r} is a chat but the {side} tokenizer has no chat template",
                )
        # Every probe goes through both tokenizers (and chat templates) here, once, so a
        # template that fails or runs away is bad input before any check runs.
        encoded = [_encode_checked(config, side, tok, probe, model_dir)
                   for side, tok in (("training", training_tok), ("serving", serving_tok))]
        # An empty prompt is a fair edge case while a BOS token conditions it; with no token on
        # either side nothing can be generated (one side empty is tokenizer_parity's finding).
        if not any(encoded):
            raise InputError(
                config.resolve(spec.probes),
                f"probe {probe.id!r}",
                "encodes to no tokens with either tokenizer (empty text, no BOS): "
                "nothing to condition on",
            )

    def sampling(side: str, tok: Any, dtype: str) -> SamplingFile:
        with keyed(f"causal_lm.sampling.{side}"):
            return _sampling_file(side, tok, dtype)

    def _sampling_file(side: str, tok: Any, dtype: str) -> SamplingFile:
        return load_sampling_file(
            config.resolve(getattr(spec.sampling, side)),
            trainer=side == "training",
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
                "dtype": "causal_lm.training.dtype"
                if side == "training"
                else (declared[0] if declared else "causal_lm.engine.dtype (default)"),
            },
        )

    training_sampling = sampling("training", training_tok, spec.training.dtype)
    serving_sampling = sampling("serving", serving_tok, spec.engine.dtype)
    contradictions = _served_dir_contradictions(
        config, spec, sources, engine_dir, serving_sampling, serving_tok, probes)
    from paritygate.families.causal_lm.logprobs import as_model_level

    fn_key = "causal_lm.training.logprob_fn"
    logprob_fn = guard_user_code(
        as_model_level(
            import_callable(spec.training.logprob_fn, cfg, fn_key),
            spec.training.logprob_convention,
        ),
        cfg,
        fn_key,
    )
    from paritygate.families.causal_lm.reference import load_reference

    kl_reference = load_reference(config, spec, model_dir, training_tok)
    from paritygate.families.causal_lm.reward import load_reward

    reward = load_reward(config, spec, probes, training_tok)
    if spec.engine.collate:  # a bad name is bad input before any check runs
        import_callable(spec.engine.collate, cfg, "causal_lm.engine.collate")
    if spec.behaviour is not None and spec.behaviour.reward_fn:
        import_callable(spec.behaviour.reward_fn, cfg, "causal_lm.behaviour.reward_fn")
    ctx = LMContext(
        config=config,
        spec=spec,
        model_dir=model_dir,
        engine_model_dir=engine_dir,
        checkpoint_path=(adapter.directory if adapter is not None
                         else files[0] if len(files) == 1 else model_dir),
        checkpoint_sha256=sha256_files(trained),
        training_tokenizer=training_tok,
        serving_tokenizer=serving_tok,
        probes=probes,
        cut_probes=[p.id for p in probes if is_cut(p, spec.max_prompt_tokens)],
        training_sampling=training_sampling,
        serving_sampling=serving_sampling,
        logprob_fn=logprob_fn,
        served_from=served_from,
        declared_dtype=declared,
        dump=dump,
        contradictions=contradictions,
        served_config_dtype=served_dtype(engine_dir),
        kl_reference=kl_reference,
        reward=reward,
        adapter=adapter,
        adapter_key=adapter_key,
        serving_adapter=serving_adapter,
    )
    return ctx


_BASE_SERVED = (
    "the training side is a base model plus causal_lm.adapter, merged in memory; {what} would "
    "serve the base without the adapter: set causal_lm.serving.model_dir to the merged copy "
    "that ships")


def _check_adapter_served(config: GateConfig, spec: CausalLMSpec) -> None:
    """With an adapter and no served directory, only the HF engine on the merged training
    model itself serves the adapter (same dtype, one device); another dtype or vLLM would load
    the base directory alone, so that is bad input, not a silent base-vs-merged comparison."""
    if spec.engine.dtype != spec.training.dtype or spec.training.device_map is not None:
        raise InputError(config.path, "causal_lm.serving.model_dir", _BASE_SERVED.format(
            what=f"the HF engine in {spec.engine.dtype}"))
    if "vllm" in spec.engines:
        raise InputError(config.path, "causal_lm.serving.model_dir",
                         _BASE_SERVED.format(what="vLLM"))


def _resolve_adapter(config: GateConfig, spec: CausalLMSpec,
                     ) -> tuple[CausalLMSpec, AdapterInfo | None, str]:
    """The spec with ``model_dir`` the base model, the adapter read and validated (``None``
    without one), and the key that named it. ``model_dir`` naming an adapter directory takes
    its base from ``adapter_config.json`` when that is a local directory."""
    from paritygate.families.causal_lm.adapter import is_adapter_dir, local_base, read_adapter

    if spec.adapter is not None:
        key = "causal_lm.adapter"
        return spec, read_adapter(config.resolve(spec.adapter), key), key
    model_dir = config.resolve(spec.model_dir)
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
    update = {"model_dir": str(base), "adapter": str(model_dir)}
    return spec.model_copy(update=update), adapter, key


def read_lm_dump(config: GateConfig, spec: CausalLMSpec, model_dir: Path) -> list[dict[str, Any]]:
    """The validated records of ``causal_lm.engine.dump``, token ids checked against the
    training model's ``vocab_size``; a bad record is bad input naming the line and field."""
    from paritygate.engines.hf_loading import config_vocab_size
    from paritygate.engines.rollout_dump import read_dump

    if not spec.engine.dump:
        raise InputError(config.path, "causal_lm.engine.dump", "engines: [dump] needs a dump file")
    with keyed("causal_lm.engine.dump"):
        return read_dump(config.resolve(spec.engine.dump),
                         vocab_size=config_vocab_size(model_dir))


def _served_dir_contradictions(
    config: GateConfig, spec: CausalLMSpec, sources: dict[str, str], served_dir: Path,
    serving_sampling: SamplingFile, serving_tok: Any, probes: list[Probe],
) -> list[Contradiction]:
    """Declared serving files that differ from the served directory's own (see
    :mod:`~paritygate.families.causal_lm.served_files`)."""
    from paritygate.families.causal_lm.served_files import (
        chat_template_contradiction,
        has_tokenizer,
        sampling_contradiction,
        tokenizer_fields,
    )

    found: list[Contradiction | None] = []
    declared_tok = config.resolve(spec.tokenizer.serving) if spec.tokenizer.serving else None
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
            config.resolve(spec.tokenizer.serving_chat_template),
            "causal_lm.tokenizer.serving_chat_template", served_dir))
    own = served_dir / "generation_config.json"
    if "sampling" in sources and own.is_file():
        with keyed(sources["sampling"]):
            own_file = load_sampling_file(
                own, trainer=False, fmt="hf_generation_config",
                eos_text=serving_tok.eos_token, eos_id=serving_tok.eos_token_id,
                side_defaults={k: serving_sampling.values.get(k)
                               for k in ("padding_side", "truncation_side", "dtype")},
            )
        found.append(sampling_contradiction(serving_sampling, own_file, sources["sampling"]))
    return [c for c in found if c is not None]


def _encode_checked(config: Any, side: str, tok: Any, probe: Probe, model_dir: Path) -> list[int]:
    """``probe``'s token ids with the ``side`` tokenizer, its rendered chat checked too; a
    chat template's failure names the template's file, its config key and the probe."""
    from paritygate.families.causal_lm.tokenizer import render_probe, template_file

    spec = config.causal_lm
    try:
        ids = encode_probe(tok, probe, spec.max_prompt_tokens)
        if probe.is_chat:
            render_probe(tok, probe, spec.max_prompt_tokens)
    except InputError as exc:
        if exc.file is not None:
            raise
        directory = getattr(spec.tokenizer, side)
        override = getattr(spec.tokenizer, f"{side}_chat_template")
        where = template_file(config.resolve(directory) if directory else model_dir,
                              config.resolve(override) if override else None)
        key = (f"causal_lm.tokenizer.{side}_chat_template" if override
               else f"causal_lm.tokenizer.{side}")
        raise InputError(where, f"{key}: {exc.key}", exc.cause) from None
    return ids
