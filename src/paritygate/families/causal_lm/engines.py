"""The serving side's generation engines (HF ``generate``, vLLM, an OpenAI-compatible
endpoint), built from explicit inputs.

The context decides which model the HF engine runs (the training model itself when it is
what ships, the served base with its adapter merged, or the served directory) and memoises
the engines; these functions only construct them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config.causal_lm import CausalLMSpec, EngineSpec
    from paritygate.engines.base import GenerationEngine
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.tokenizer import Tokenizer


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
