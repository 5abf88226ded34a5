"""The serving side's generation engines (HF ``generate``, vLLM, an OpenAI-compatible
endpoint), built from explicit inputs.

:class:`Engines` holds them for one gate run, each built on first use from the two sides: it
decides which model the HF engine runs (the training model itself when it is what ships, the
served base with its adapter merged, or the served directory) and which directory vLLM
serves; the functions below only construct them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.engine_sampling import applied_by
from paritygate.families.causal_lm.sides import serves_training_files

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config.causal_lm import CausalLMSpec, EngineSpec
    from paritygate.engines.base import GenerationEngine
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.sampling import SamplingFile
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.families.causal_lm.tokenizer import Tokenizer

NAMES = ("hf", "vllm", "endpoint")
"""The serving engines a gate names in ``causal_lm.engines``."""


@dataclass(frozen=True, eq=False)
class Engines:
    """The serving side's engines by name (``engines["hf"]``), each built once, on first use
    (``cached_property`` past the frozen record, as :class:`.LMSide` loads its model)."""

    training: LMSide
    serving: LMSide
    spec: CausalLMSpec
    seed: int
    """The gate's seed (vLLM's engine seed)."""
    config_path: Path
    """The gate file, named when vLLM cannot serve what the config declares."""

    def __getitem__(self, name: str) -> GenerationEngine:
        """The engine ``name`` (``hf``, ``vllm`` or ``endpoint``), built once."""
        if name not in NAMES:
            raise ValueError(f"unknown engine {name!r}")
        engine: GenerationEngine = getattr(self, name)
        return engine

    def serves_training_model(self) -> bool:
        """The HF engine would load exactly the training model (same files and dtype, one
        device): it then runs on the loaded training model instead of a second copy."""
        return (serves_training_files(self.training, self.serving)
                and self.serving.dtype == self.training.dtype
                and self.training.device_map is None)

    def applied(self, name: str) -> SamplingFile:
        """The serving sampling config as engine ``name`` applies it (:mod:`.engine_sampling`)."""
        return applied_by(name, self.serving.sampling)

    @cached_property
    def hf(self) -> GenerationEngine:
        """HF ``generate`` on the training model when it is what ships, on the served base
        with its adapter merged, else on the served directory."""
        tok = self.serving.tokenizer
        if self.serves_training_model():
            return hf_engine(self.spec.engine, tok, model=self.training.model())
        if self.serving.adapter is not None:
            return hf_engine(self.spec.engine, tok, model=self.serving.model())
        with keyed(self.serving.key):
            return hf_engine(self.spec.engine, tok, model_dir=self.serving.model_dir,
                             trust_remote_code=self.serving.trust_remote_code)

    @cached_property
    def endpoint(self) -> GenerationEngine:
        """The OpenAI-compatible server of ``causal_lm.endpoint``."""
        return endpoint_engine(self.spec)

    @cached_property
    def vllm(self) -> GenerationEngine:
        """vLLM serving :meth:`vllm_model_dir` (the served adapter as a LoRA)."""
        tok_dir = self.spec.tokenizer.serving
        return vllm_engine(
            self.spec, self.vllm_model_dir(), self.serving.adapter,
            tokenizer_dir=tok_dir if tok_dir else None, seed=self.seed,
            max_new_tokens=self.serving.sampling.spec().max_new_tokens,
            trust_remote_code=self.serving.trust_remote_code,
        )

    def vllm_model_dir(self) -> Path:
        """The directory vLLM serves: the served one, or, when it holds keys under
        ``training_only_heads`` (a TRL value head), a temporary copy without them, as
        ``paritygate export`` writes it (vLLM refuses parameters its model class lacks)."""
        return self._vllm_model_dir

    @cached_property
    def _vllm_model_dir(self) -> Path:
        from paritygate.families.causal_lm.export import servable_copy
        from paritygate.families.causal_lm.inputs import BASE_SERVED

        if (self.training.adapter is not None
                and serves_training_files(self.training, self.serving)):
            raise InputError(self.config_path, "causal_lm.serving.model_dir",
                             BASE_SERVED.format(what="vLLM"))
        return servable_copy(self.serving.model_dir, list(self.spec.training_only_heads))

    def close(self) -> None:
        """Shut down the engines that hold processes (vLLM's engine core and its workers),
        when the run ends: the shutdown then happens while the streams vLLM's loggers write to
        are open, not in vLLM's exit-time finalizers (which log to a stream the test runner
        has closed: "--- Logging error ---" tracebacks)."""
        engine = self.__dict__.pop("vllm", None)
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def hf_engine(
    spec: EngineSpec, tokenizer: Tokenizer, *, model: nn.Module | None = None,
    model_dir: Path | None = None, trust_remote_code: bool = False,
) -> GenerationEngine:
    """The HF engine on a loaded ``model``, else on ``model_dir`` loaded in ``spec.dtype``."""
    from paritygate.engines.hf_generate import HFGenerateEngine

    options = {
        "logprobs_mode": spec.logprobs_mode,
        "top_logprobs": spec.top_logprobs,
        "batch_size": spec.batch_size,
    }
    if model is not None:
        return HFGenerateEngine.for_tokenizer(model, tokenizer, **options)
    assert model_dir is not None
    return HFGenerateEngine.from_dir(
        model_dir, tokenizer, dtype=spec.dtype, trust_remote_code=trust_remote_code, **options
    )


def vllm_engine(
    spec: CausalLMSpec, model_dir: Path, lora: AdapterInfo | None, *,
    tokenizer_dir: Path | None, seed: int, max_new_tokens: int, trust_remote_code: bool,
) -> GenerationEngine:
    """vLLM serving ``model_dir`` (with ``lora`` as a LoRA adapter when one is served)."""
    from paritygate.engines.vllm_engine import VLLMEngine

    eng = spec.engine
    return VLLMEngine(
        model_dir,
        lora_dir=lora.directory if lora is not None else None,
        max_lora_rank=max(lora.ranks()) if lora is not None and lora.ranks() else None,
        tokenizer_dir=tokenizer_dir,
        dtype=eng.dtype,
        seed=seed,
        logprobs_mode=eng.logprobs_mode,
        top_logprobs=eng.top_logprobs,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        tensor_parallel_size=eng.tensor_parallel_size,
        max_model_len=spec.max_prompt_tokens + max_new_tokens,
        engine_kwargs={"trust_remote_code": trust_remote_code},
    )


def endpoint_engine(spec: CausalLMSpec) -> GenerationEngine:
    """The OpenAI-compatible server of ``causal_lm.endpoint``."""
    from paritygate.engines.openai_endpoint import EndpointEngine

    ep = spec.endpoint
    assert ep is not None  # checked when the config loaded
    return EndpointEngine(
        ep.base_url, ep.model, api_key_env=ep.api_key_env, timeout_s=ep.timeout_s,
        retries=ep.retries, concurrency=ep.concurrency, top_logprobs=spec.engine.top_logprobs,
        logprobs_mode=spec.engine.logprobs_mode, sampling=ep.sampling,
    )
