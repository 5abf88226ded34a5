"""The causal-LM family context: everything the LM checks share, loaded and validated once.

Building it reads the config's files (model directory, tokenizers, sampling
configs, probes) and raises :class:`~paritygate.errors.InputError` naming the
file and key of the first bad input. Models, engines and generations are loaded
lazily and cached, so a gate that runs one check pays only for that check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.engines.base import GenerationEngine
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.hf_loading import load_causal_lm, safetensors_files
from paritygate.errors import InputError
from paritygate.families.causal_lm.probes import Probe, load_probes
from paritygate.families.causal_lm.sampling import SamplingFile, load_sampling_file
from paritygate.families.causal_lm.tokenizer import encode_probe, load_tokenizer
from paritygate.imports import import_callable
from paritygate.provenance import sha256_file, sha256_files

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.families.causal_lm.config import CausalLMSpec
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
    family: str = "causal_lm"
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def probes_sha256(self) -> str:
        """Digest of the probe prompts file."""
        if "probes_sha256" not in self._cache:
            self._cache["probes_sha256"] = sha256_file(self.config.resolve(self.spec.probes))
        return self._cache["probes_sha256"]

    # -- weights -----------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """Every tensor of the training directory's safetensors files (read on each call, so
        the run does not hold a second copy of the weights)."""
        from paritygate.families.causal_lm.weights import read_state

        return read_state(self.model_dir)

    def engine_weights_sha256(self) -> str:
        """Digest of the weights the inference engine loads (same scheme as the checkpoint's)."""
        return sha256_files(safetensors_files(self.engine_model_dir))

    # -- models ------------------------------------------------------------------
    def _load_reference(self) -> tuple[Any, dict[str, Any]]:
        if "reference" not in self._cache:
            self._cache["reference"] = load_causal_lm(
                self.model_dir,
                self.spec.training.dtype,
                trust_remote_code=self.config.trust_remote_code,
            )
        return self._cache["reference"]

    def reference_model(self) -> Any:
        """The training-side model (training dtype, eval mode), value head not attached."""
        return self._load_reference()[0]

    def reference_loading_info(self) -> dict[str, Any]:
        return self._load_reference()[1]

    def teacher_forced_logits(self, prompt: list[int], output: list[int]) -> Any:
        """The training model's next-token logits over ``output`` after ``prompt``, (N, V)."""
        from paritygate.families.causal_lm.recompute import teacher_forced_logits

        return teacher_forced_logits(self.reference_model(), prompt, output)

    def engine(self, name: str = "hf") -> GenerationEngine:
        """The inference engine ``name`` (``hf`` or ``vllm``), built once."""
        key = f"engine:{name}"
        if key not in self._cache:
            eng = self.spec.engine
            if name == "hf":
                from paritygate.engines.hf_generate import HFGenerateEngine

                self._cache[key] = HFGenerateEngine.from_dir(
                    self.engine_model_dir,
                    self.serving_tokenizer,
                    dtype=eng.dtype,
                    trust_remote_code=self.config.trust_remote_code,
                    logprobs_mode=eng.logprobs_mode,
                    top_logprobs=eng.top_logprobs,
                    batch_size=eng.batch_size,
                )
            elif name == "vllm":
                from paritygate.engines.vllm_engine import VLLMEngine

                tok_dir = self.spec.tokenizer.serving
                self._cache[key] = VLLMEngine(
                    self.engine_model_dir,
                    tokenizer_dir=self.config.resolve(tok_dir) if tok_dir else None,
                    dtype=eng.dtype,
                    seed=self.config.seed,
                    logprobs_mode=eng.logprobs_mode,
                    top_logprobs=eng.top_logprobs,
                    gpu_memory_utilization=eng.gpu_memory_utilization,
                    max_model_len=self.spec.max_prompt_tokens
                    + self.serving_sampling.spec().max_new_tokens,
                    engine_kwargs={"trust_remote_code": self.config.trust_remote_code},
                )
            else:
                raise ValueError(f"unknown engine {name!r}")
        return self._cache[key]

    # -- prompts and generations ------------------------------------------------
    def prompts(self, side: str = "serving") -> list[list[int]]:
        """Probe prompts as token ids, encoded by the ``serving`` or ``training`` tokenizer."""
        tok = self.serving_tokenizer if side == "serving" else self.training_tokenizer
        key = f"prompts:{side}"
        if key not in self._cache:
            self._cache[key] = [
                encode_probe(tok, p, self.spec.max_prompt_tokens) for p in self.probes
            ]
        return self._cache[key]

    def render_probe(self, side: str, probe: Probe) -> str:
        """The prompt text of ``probe`` after the ``side`` tokenizer's chat template."""
        from paritygate.families.causal_lm.tokenizer import render_probe

        tok = self.serving_tokenizer if side == "serving" else self.training_tokenizer
        return render_probe(tok, probe)

    def sampled(self, engine: str = "hf") -> tuple[Generation, SamplingSpec]:
        """Sampled continuations (``generation_samples`` per probe) under the serving config."""
        key = f"sampled:{engine}"
        if key not in self._cache:
            sampling = self.serving_sampling.spec()
            if sampling.seed is None:
                sampling = SamplingSpec(**{**sampling.as_dict(), "seed": self.config.seed})
            prompts = [p for p in self.prompts() for _ in range(self.spec.generation_samples)]
            self._cache[key] = (self.engine(engine).generate(prompts, sampling), sampling)
        return self._cache[key]

    def greedy(self, engine: str = "hf") -> Generation:
        """Greedy continuations of every probe under the serving config's length and stops."""
        key = f"greedy:{engine}"
        if key not in self._cache:
            sampling = self.serving_sampling.spec().greedy()
            self._cache[key] = self.engine(engine).generate(self.prompts(), sampling)
        return self._cache[key]

    def recompute(self, generation: Generation) -> tuple[Any, Any, Any]:
        """The trainer's log-probs of every generated token: ``(logp_train, logp_infer, mask)``."""
        from paritygate.families.causal_lm.recompute import recompute

        return recompute(self, generation)

    def precision_subject(self) -> PrecisionSubject:
        """The HF model in fp32 eval, probe prompts as left-padded batches of input ids; refuses
        (``refusal``) when a model tensor is left at random init or a checkpoint key unused."""
        import torch

        from paritygate.precision.subject import PrecisionSubject

        prompts = self.prompts("training")
        pad = self.training_tokenizer.pad_token_id
        batches = []
        for start in range(0, len(prompts), 4):
            chunk = prompts[start : start + 4]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            batches.append(((), {"input_ids": ids, "attention_mask": mask}))

        import dataclasses

        from paritygate.precision.hf import checkpoint_coverage

        model, info = load_causal_lm(
            self.model_dir, "float32", trust_remote_code=self.config.trust_remote_code
        )
        coverage = checkpoint_coverage(model, safetensors_files(self.model_dir), info)
        heads = tuple(self.spec.training_only_heads)
        coverage = dataclasses.replace(
            coverage, unused=[k for k in coverage.unused if not k.startswith(heads)]
        )
        return PrecisionSubject(
            name=self.config.name,
            build_model=lambda: model,
            batches=batches,
            select_output=lambda out: out.logits,
            refusal=coverage.refusal(),
        )


def build_lm_context(config: GateConfig) -> LMContext:
    """Validate and load the inputs of a causal-LM gate; raises InputError naming file and key."""
    spec = config.causal_lm
    if spec is None:
        raise InputError(config.path, "causal_lm", "family causal_lm needs a causal_lm section")
    cfg = config.path
    model_dir = config.resolve(spec.model_dir)
    if not model_dir.is_dir():
        raise InputError(cfg, "causal_lm.model_dir", f"model directory not found: {model_dir}")
    if not (model_dir / "config.json").is_file():
        raise InputError(model_dir / "config.json", None, "model directory has no config.json")
    files = safetensors_files(model_dir)
    engine_dir = config.resolve(spec.engine.model_dir) if spec.engine.model_dir else model_dir
    if not (engine_dir / "config.json").is_file():
        raise InputError(
            cfg, "causal_lm.engine.model_dir", f"no HF model directory at {engine_dir}"
        )

    def tokenizer(side: str) -> Any:
        tspec = spec.tokenizer
        directory = getattr(tspec, side)
        template = getattr(tspec, f"{side}_chat_template")
        return load_tokenizer(
            config.resolve(directory) if directory else model_dir,
            config.resolve(template) if template else None,
            trust_remote_code=config.trust_remote_code,
        )

    training_tok = tokenizer("training")
    serving_tok = tokenizer("serving")
    probes = load_probes(config.resolve(spec.probes))
    for probe in probes:
        for side, tok in (("training", training_tok), ("serving", serving_tok)):
            if probe.is_chat and not getattr(tok, "chat_template", None):
                raise InputError(
                    cfg,
                    f"causal_lm.tokenizer.{side}",
                    f"probe {probe.id!r} is a chat but the {side} tokenizer has no chat template",
                )
    training_sampling = load_sampling_file(
        config.resolve(spec.sampling.training),
        trainer=True,
        side_defaults={
            "padding_side": training_tok.padding_side,
            "truncation_side": training_tok.truncation_side,
            "dtype": spec.training.dtype,
        },
    )
    serving_sampling = load_sampling_file(
        config.resolve(spec.sampling.serving),
        trainer=False,
        side_defaults={
            "padding_side": serving_tok.padding_side,
            "truncation_side": serving_tok.truncation_side,
            "dtype": spec.engine.dtype,
        },
    )
    logprob_fn = import_callable(spec.training.logprob_fn, cfg, "causal_lm.training.logprob_fn")
    return LMContext(
        config=config,
        spec=spec,
        model_dir=model_dir,
        engine_model_dir=engine_dir,
        checkpoint_path=files[0] if len(files) == 1 else model_dir,
        checkpoint_sha256=sha256_files(files),
        training_tokenizer=training_tok,
        serving_tokenizer=serving_tok,
        probes=probes,
        training_sampling=training_sampling,
        serving_sampling=serving_sampling,
        logprob_fn=logprob_fn,
    )
