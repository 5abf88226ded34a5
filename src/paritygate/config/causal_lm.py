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

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from paritygate.config.sampling_fields import OFF_POLICY
from paritygate.config_base import ConfigPath, Dtype, StrictModel
from paritygate.sections import compose


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

    training: ConfigPath | None = None
    """Defaults to ``model_dir``."""
    serving: ConfigPath | None = None
    """Defaults to the served directory's own tokenizer (``serving.model_dir``, else
    ``model_dir``); one declared elsewhere that differs from it fails ``tokenizer_parity``
    (``serving_file_contradicts_served_dir``)."""
    training_chat_template: ConfigPath | None = None
    """A Jinja file overriding the training tokenizer's template."""
    serving_chat_template: ConfigPath | None = None
    allow: list[AllowEntry] = Field(default_factory=list)
    """Accepted differences: ``bos_token_id``, ``eos_token_id``, ``pad_token_id``,
    ``padding_side``, ``truncation_side``, ``chat_template``, ``token_ids``; ``served_dir``: a
    declared serving tokenizer or template the served engine reads instead of the served
    directory's own."""


SamplingFormat = Literal["auto", "trainer", "hf_generation_config", "vllm", "trl"]


class SamplingFiles(StrictModel):
    """The trainer's sampling config and the serving one, plus accepted differences."""

    training: str
    """YAML or JSON with the trainer's sampling fields, the trainer's own TRL config YAML (the
    file ``trl grpo --config`` reads), or an HF ``generation_config.json``."""
    serving: str | None = None
    """The serving ``generation_config.json`` or a vLLM sampling-parameters YAML; default:
    ``serving.generation_config``, else ``generation_config.json`` of the served directory. A
    generation config declared elsewhere that differs from the served directory's own fails
    ``sampling_config`` (``serving_file_contradicts_served_dir``; allow-list field
    ``served_dir``)."""
    training_format: SamplingFormat = "auto"
    """``auto`` detects the format from the content (reported by ``sampling_config``)."""
    serving_format: SamplingFormat = "auto"
    allow: list[AllowEntry] = Field(default_factory=list)
    strict: bool = False
    """A TRL config's fields that change sampling but cannot be mapped (``generation_kwargs``
    the gate does not model, guided decoding) are bad input (exit 2) instead of listed."""


class ServingSpec(StrictModel):
    """What is served: absent fields come from the served directory's own files."""

    model_dir: ConfigPath | None = None
    """The served HF directory (default: ``causal_lm.model_dir``)."""
    tokenizer: ConfigPath | None = None
    """The served tokenizer directory (default: the served ``model_dir``'s own)."""
    generation_config: str | None = None
    """The served sampling config (default: ``<served model_dir>/generation_config.json``)."""
    engine: Literal["hf", "vllm", "dump", "endpoint"] | None = None
    """The serving engine; sets ``engines`` when that key is absent."""
    dtype: Dtype | None = None
    """The dtype the engine computes in (same as ``engine.dtype``; default: the served
    ``config.json``'s ``dtype``, else float32)."""
    adapter: ConfigPath | None = None
    """A PEFT adapter served on ``model_dir`` (the served base): vLLM serves it through its
    LoRA support (``enable_lora``, one ``LoRARequest`` per request); the HF engine and
    ``weights_load`` merge it in memory with peft, as the training side is merged."""
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
    logprob_applies: list[str] = Field(default_factory=list)
    """Distribution-moving sampling fields (penalties, ``logit_bias``, ``min_new_tokens``...)
    that ``logprob_fn`` applies exactly as the engine does, so log-probs of samples drawn
    under them are the trainer's own: ``sampling_config`` then does not name them
    ``off_policy_transform``."""
    dtype: Dtype = "float32"
    device_map: Literal["auto"] | None = None
    """``auto``: the recompute model is dispatched over every visible device by accelerate
    (``pip install accelerate``), for models larger than one device."""

    @field_validator("logprob_applies")
    @classmethod
    def _off_policy_fields(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in OFF_POLICY]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a distribution-moving sampling field "
                             f"(one of {', '.join(OFF_POLICY)})")
        return value


MAX_TOP_LOGPROBS = 20
"""``engine.top_logprobs`` is at most 20, vLLM's default ``max_logprobs`` and the OpenAI API's
limit; each is held per generated token."""


class EngineSpec(StrictModel):
    """The inference engine's settings (for every engine in ``engines``)."""

    model_dir: ConfigPath | None = None
    """The directory the engine loads (same as ``serving.model_dir``); defaults to ``model_dir``."""
    dtype: Dtype = "float32"
    logprobs_mode: Literal["raw", "processed"] = "processed"
    top_logprobs: int = Field(5, ge=0, le=MAX_TOP_LOGPROBS)
    """Top log-probs per token each engine reports (at most :data:`MAX_TOP_LOGPROBS`)."""
    batch_size: int = Field(8, ge=1)
    """Rows per HF ``generate`` call. ``behaviour_parity`` samples each prompt's ``samples``
    in one unpadded batch unless this is set."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM only."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM only: GPUs the served model is sharded over (vLLM ``tensor_parallel_size``)."""
    dump: ConfigPath | None = None
    """``engines: [dump]``: the rollout dump file (JSONL or Parquet) to audit."""
    collate: str | None = None
    """``module:callable(rows, pad_token_id, padding_side) -> {"input_ids", "attention_mask",
    "position_ids"}``: how the serving stack lays a batch out for the HF model
    (``batch_invariance``); default: pad on the tokenizer's side, positions from the mask."""


MAX_GENERATION_SAMPLES = 256
"""``generation_samples`` is at most 256 continuations per probe: the log-prob delta is judged
per token, and a probe's 256 continuations are thousands of tokens; more only cost time."""

class EndpointSpec(StrictModel):
    """``engines: [endpoint]``: an OpenAI-compatible completions server (``vllm serve``)
    serving the model in ``serving.model_dir``; requests carry token ids."""

    base_url: str = Field(pattern=r"^https?://")
    """The API root, e.g. ``http://127.0.0.1:8000/v1`` (``/completions`` and ``/models``
    are under it)."""
    model: str
    """The model name the server serves (``--served-model-name``; ``GET /models`` lists it)."""
    api_key_env: str | None = None
    """The NAME of an environment variable holding the API key (sent as a bearer token,
    never written to a report)."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds one request may take before it is retried."""
    retries: int = Field(2, ge=0, le=10)
    """Retries of a request that got no answer (refused, timed out, HTTP 5xx/429)."""
    concurrency: int = Field(8, ge=1, le=256)
    """Requests in flight at once (``batch_invariance`` sends each batch concurrently)."""
    sampling: Literal["server", "request"] = "server"
    """``server``: sampled requests leave temperature, top_p, top_k, min_p and
    repetition_penalty to the server's defaults (its generation config), as a client that
    does not set them gets; ``request``: the serving sampling config's values are sent."""


class CausalLMSpec(StrictModel):
    """A Hugging Face causal LM checked against its serving path."""

    model_dir: ConfigPath
    """An HF model directory, or a trainer ``output_dir`` of ``checkpoint-N`` folders."""
    checkpoint: int | Literal["latest", "final"] | None = None
    """With a trainer ``output_dir`` as ``model_dir``: the step N of ``checkpoint-N`` to gate,
    ``latest`` (the default) or ``final`` (the model saved at the output_dir's top)."""
    adapter: ConfigPath | None = None
    """A PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) trained
    on ``model_dir``: the training side is the base with the adapter merged in memory (peft).
    ``model_dir`` may instead name the adapter directory itself; its base is then
    ``base_model_name_or_path`` of ``adapter_config.json`` when that is a local directory."""
    training_only_heads: list[str] = Field(default_factory=list)
    """Key prefixes present only in the training checkpoint (TRL value head: ``v_head.``)."""
    serving: ServingSpec = ServingSpec()
    tokenizer: TokenizerSpec = TokenizerSpec()
    sampling: SamplingFiles
    probes: ConfigPath
    """JSONL: one object per line, ``{"id", "text"}`` or ``{"id", "messages": [...]}``."""
    max_prompt_tokens: int = Field(128, ge=1)
    engines: list[Literal["hf", "vllm", "dump", "endpoint"]] = Field(
        default_factory=lambda: list[Literal["hf", "vllm", "dump", "endpoint"]](["hf"]))
    """Engines ``logprob_delta`` and ``generation_parity`` compare; vLLM is ``vllm_delta``'s."""
    training: TrainingSide = TrainingSide()
    engine: EngineSpec = EngineSpec()
    endpoint: EndpointSpec | None = None
    """The server ``engines: [endpoint]`` sends its requests to."""
    precision_tier: str | None = None
    """Threshold tier of ``logprob_delta`` (``<training>/<inference>``, e.g. ``fp32/fp32``);
    default: from the two dtypes."""
    ratio_eps: float = Field(0.2, gt=0, lt=1)
    """PPO clip range: tokens whose ratio exp(delta) leaves [1-eps, 1+eps] are counted."""
    near_tie_margin: float = Field(1e-3, ge=0)
    """generation_parity excuses a divergence only where the top-2 logit margin is below this;
    unset, a copy served at a declared lower precision takes its tier's margin."""
    generation_samples: int = Field(2, ge=1, le=MAX_GENERATION_SAMPLES)
    """Sampled continuations per probe for ``logprob_delta`` (at most
    :data:`MAX_GENERATION_SAMPLES`)."""

    def tier(self, engine_dtype: str | None = None) -> str:
        """The precision tier key: the configured one, else ``<training>/<inference>``."""
        if self.precision_tier:
            return self.precision_tier
        from paritygate.metrics.tiers import tier_for

        return tier_for(self.training.dtype, engine_dtype or self.engine.dtype)[0]


# The checks' own blocks (paritygate.sections, one module per check) follow the fields above; a
# check reads its block with ``Section.of(spec)``, so the type checker sees the fields above alone.
if not TYPE_CHECKING:
    CausalLMSpec = compose(CausalLMSpec, "causal_lm")
