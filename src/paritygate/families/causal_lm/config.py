"""Config section of the causal-LM family (``causal_lm:`` in a gate YAML).

Paths are relative to the gate config file. Example::

    causal_lm:
      model_dir: ../demo/lm/model
      training_only_heads: [v_head.]
      tokenizer: {training: ../demo/lm/model, serving: ../demo/lm/model}
      sampling:
        training: sampling/demo-lm-train.yaml
        serving: sampling/demo-lm-vllm.yaml
      probes: ../golden/demo-lm/probes.jsonl
      engines: [hf]
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from paritygate.config_base import StrictModel

Dtype = Literal["float32", "bfloat16", "float16"]


class AllowEntry(StrictModel):
    """One accepted difference; the reason is mandatory and shown in the report."""

    field: str
    reason: str = Field(min_length=3)

    @field_validator("reason")
    @classmethod
    def _real_reason(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("an allow-list entry needs a reason")
        return value


class TokenizerSpec(StrictModel):
    """Training and serving tokenizers (HF tokenizer directories) and chat templates."""

    training: str | None = None
    """Defaults to ``model_dir``."""
    serving: str | None = None
    """Defaults to ``model_dir``."""
    training_chat_template: str | None = None
    """A Jinja file overriding the training tokenizer's template."""
    serving_chat_template: str | None = None
    allow: list[AllowEntry] = Field(default_factory=list)
    """Accepted differences: ``bos_token_id``, ``eos_token_id``, ``pad_token_id``,
    ``padding_side``, ``truncation_side``, ``chat_template``, ``token_ids``."""


SamplingFormat = Literal["auto", "trainer", "hf_generation_config", "vllm"]


class SamplingFiles(StrictModel):
    """The trainer's sampling config and the serving one, plus accepted differences."""

    training: str
    """YAML or JSON with the trainer's sampling fields."""
    serving: str | None = None
    """The serving ``generation_config.json`` or a vLLM sampling-parameters YAML; default:
    ``serving.generation_config``, else ``generation_config.json`` of the served directory."""
    training_format: SamplingFormat = "auto"
    """``auto`` detects the format from the content (reported by ``sampling_config``)."""
    serving_format: SamplingFormat = "auto"
    allow: list[AllowEntry] = Field(default_factory=list)


class ServingSpec(StrictModel):
    """What is served: every field falls back to the training side when absent."""

    model_dir: str | None = None
    """The served HF directory (default: ``causal_lm.model_dir``)."""
    tokenizer: str | None = None
    """The served tokenizer directory (default: the served ``model_dir``)."""
    generation_config: str | None = None
    """The served sampling config (default: ``<served model_dir>/generation_config.json``)."""
    engine: Literal["hf", "vllm", "dump"] | None = None
    """The serving engine; sets ``engines`` when that key is absent."""
    dtype: Dtype | None = None
    """The dtype the engine computes in (same as ``engine.dtype``; default float32)."""
    batch_invariant: bool = False
    """The engine claims batch-invariant numerics (vLLM ``VLLM_BATCH_INVARIANT``):
    ``batch_invariance`` then requires bitwise equality."""


class TrainingSide(StrictModel):
    """How the trainer recomputes log-probs."""

    logprob_fn: str = "paritygate.families.causal_lm.logprobs:compute_logprobs"
    """``module:callable`` with the signature of
    :func:`paritygate.families.causal_lm.logprobs.compute_logprobs`."""
    logprob_convention: Literal["auto", "model", "logits"] = "auto"
    """``model``: ``fn(model, input_ids, attention_mask, *, temperature, top_k, top_p, mode)``;
    ``logits``: ``fn(logits, input_ids, attention_mask, temperature)``; ``auto``: ``logits``
    when the first parameter is named ``logits``."""
    logprobs_mode: Literal["raw", "processed"] = "processed"
    """``processed``: the trainer scores tokens under the sampling distribution (temperature,
    top-k/top-p applied); ``raw``: under the model's plain softmax."""
    dtype: Dtype = "float32"
    device_map: Literal["auto"] | None = None
    """``auto``: the recompute model is dispatched over every visible device by accelerate
    (``pip install accelerate``), for models larger than one device."""


class EngineSpec(StrictModel):
    """The inference engine's settings (for every engine in ``engines``)."""

    model_dir: str | None = None
    """The directory the engine loads (same as ``serving.model_dir``); defaults to ``model_dir``."""
    dtype: Dtype = "float32"
    logprobs_mode: Literal["raw", "processed"] = "processed"
    top_logprobs: int = Field(5, ge=0)
    batch_size: int = Field(8, ge=1)
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM only."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM only: GPUs the served model is sharded over (vLLM ``tensor_parallel_size``)."""
    dump: str | None = None
    """``engines: [dump]``: the rollout dump file (JSONL or Parquet) to audit."""
    collate: str | None = None
    """``module:callable(rows, pad_token_id, padding_side) -> {"input_ids", "attention_mask",
    "position_ids"}``: how the serving stack lays a batch out for the HF model
    (``batch_invariance``); default: pad on the tokenizer's side, positions from the mask."""


class BehaviourSpec(StrictModel):
    """``behaviour_parity``: both sides sampled with their own config on the probes."""

    samples: int = Field(64, ge=8)
    """Samples per prompt per side; below 8 per prompt the rank tests lack power."""
    alpha: float = Field(0.01, gt=0, lt=1)
    """Family-wise false-alarm rate of the tests (Holm's correction)."""
    format_regex: str | None = None
    """A completion matching this regex (``re.search``) is a format hit."""
    reward_fn: str | None = None
    """``module:callable(prompt: str, completion: str) -> float``: E[reward] compared."""
    reward_tolerance: float = Field(0.05, gt=0)
    """Largest E[reward] difference accepted (the offline equivalence check's roll-back figure)."""

    @field_validator("format_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            import re

            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class CausalLMSpec(StrictModel):
    """A Hugging Face causal LM checked against its serving path."""

    model_dir: str
    training_only_heads: list[str] = Field(default_factory=list)
    """Key prefixes present only in the training checkpoint (TRL value head: ``v_head.``)."""
    serving: ServingSpec = ServingSpec()
    tokenizer: TokenizerSpec = TokenizerSpec()
    sampling: SamplingFiles
    probes: str
    """JSONL: one object per line, ``{"id", "text"}`` or ``{"id", "messages": [...]}``."""
    max_prompt_tokens: int = Field(128, ge=1)
    engines: list[Literal["hf", "vllm", "dump"]] = Field(
        default_factory=lambda: list[Literal["hf", "vllm", "dump"]](["hf"]))
    """Engines ``logprob_delta`` and ``generation_parity`` compare; vLLM is ``vllm_delta``'s."""
    training: TrainingSide = TrainingSide()
    engine: EngineSpec = EngineSpec()
    precision_tier: str | None = None
    """Threshold tier of ``logprob_delta`` (``<training>/<inference>``, e.g. ``fp32/fp32``);
    default: from the two dtypes."""
    ratio_eps: float = Field(0.2, gt=0, lt=1)
    """PPO clip range: tokens whose ratio exp(delta) leaves [1-eps, 1+eps] are counted."""
    near_tie_margin: float = Field(1e-3, ge=0)
    """generation_parity excuses a divergence only where the top-2 logit margin is below this."""
    generation_samples: int = Field(2, ge=1)
    """Sampled continuations per probe for ``logprob_delta``."""
    behaviour: BehaviourSpec | None = None
    """``behaviour_parity``'s settings; the check is skipped without them."""

    def tier(self, engine_dtype: str | None = None) -> str:
        """The precision tier key: the configured one, else ``<training>/<inference>``."""
        if self.precision_tier:
            return self.precision_tier
        from paritygate.metrics.tiers import tier_for

        return tier_for(self.training.dtype, engine_dtype or self.engine.dtype)[0]
