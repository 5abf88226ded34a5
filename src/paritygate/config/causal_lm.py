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

from pydantic import Field, field_validator, model_validator

from paritygate.config.sampling_fields import OFF_POLICY
from paritygate.config_base import ConfigPath, StrictModel

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

MAX_BEHAVIOUR_SAMPLES = 4096
"""``behaviour.samples`` is at most 4,096 per prompt per side: at that many the tests detect a
length shift of 0.1 standard deviations and a rate change of 0.03 at 90% power (Holm-corrected
at alpha 0.01); more samples only cost generation time."""


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


class BehaviourSpec(StrictModel):
    """``behaviour_parity``: both sides sampled with their own config on the probes."""

    samples: int = Field(64, ge=8, le=MAX_BEHAVIOUR_SAMPLES)
    """Samples per prompt per side; below 8 per prompt the rank tests lack power; at most
    :data:`MAX_BEHAVIOUR_SAMPLES`."""
    alpha: float = Field(0.01, gt=0, lt=1)
    """Family-wise false-alarm rate of the tests (Holm's correction)."""
    format_regex: str | None = None
    """A completion matching this regex (``re.search``) is a format hit."""
    reward_fn: str | None = None
    """``module:callable(prompt: str, completion: str) -> float``: E[reward] compared."""
    reward_tolerance: float = Field(0.05, gt=0)
    """Largest E[reward] difference accepted (the offline equivalence check's roll-back figure)."""
    training_dump: str | list[str] | None = None
    """The training side's samples from rollout dumps (a file, a glob or a list: the shards a
    distributed sampler wrote) instead of HF ``generate``; records need ``prompt_ids``,
    ``completion_ids`` and ``finish_reason``."""
    serving_dump: str | list[str] | None = None
    """The serving side's samples from rollout dumps (as ``training_dump``)."""
    batch_size: int = Field(256, ge=1)
    """Records read and teacher-forced per step: the audit's memory is O(batch_size)."""

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


class ReferenceSpec(StrictModel):
    """The KL reference model of the RL loop (``reference_parity``)."""

    model_dir: ConfigPath
    """The reference model's HF directory, as the trainer loads it."""
    initial: str
    """The initial policy the reference must equal: its HF directory, or a sha256 recorded at
    the start of training (``sha256sum model.safetensors``, or the tensor digest
    ``paritygate.families.causal_lm.reference:state_digest`` prints)."""
    logprob_fn: str | None = None
    """The trainer's reference log-prob function (default: ``training.logprob_fn``)."""
    logprob_convention: Literal["auto", "model", "logits"] = "auto"
    kl_estimator: str = "k3"
    """``k1``, ``k2``, ``k3`` or ``module:callable`` called as ``f(logp, logp_ref, mask)``
    (each ``(B, T)``, ``mask`` 1 on real tokens) returning either the per-token KL term
    ``(B, T)`` (TRL GRPO's ``per_token_kl``: ``exp(ref - logp) - (ref - logp) - 1``) or one
    value per sequence ``(B,)``, reduced over the mask as ``kl_reduction`` says."""
    kl_reduction: Literal["mean", "sum"] = "mean"
    """How a per-sequence estimator reduces its per-token terms: ``mean`` (masked mean,
    ``sum(k * mask, -1) / sum(mask, -1)``, as TRL and verl do) or ``sum``
    (``sum(k * mask, -1)``). Not read for a per-token estimator."""
    dtype: Dtype | None = None
    """The dtype the reference is stored in, when lower than the initial policy's (declared:
    its tensors must be the initial ones cast exactly)."""


class RewardScoring(StrictModel):
    """How one side feeds the reward model: layout, length limit and what it is shown."""

    padding_side: Literal["left", "right"] | None = None
    """Default: the reward tokenizer's."""
    max_length: int | None = Field(None, ge=1)
    """Tokens kept per scored text (default: all)."""
    truncation_side: Literal["left", "right"] | None = None
    """Which end ``max_length`` cuts (default: the reward tokenizer's)."""
    scored_span: Literal["prompt_completion", "completion"] = "prompt_completion"
    """What the reward model is shown: the prompt and the completion, or the completion only."""
    chat_template: bool = False
    """Render ``[user: prompt, assistant: completion]`` with the reward tokenizer's template."""
    append_eos: bool = True
    """Append the EOS token to the text (TRL's ``RewardTrainer`` does)."""
    batch_size: int = Field(8, ge=1)


class RewardSpec(StrictModel):
    """The reward of the RL loop (``reward_parity``): a reward model and/or a reward function."""

    model_dir: ConfigPath | None = None
    """HF ``AutoModelForSequenceClassification`` directory with one label (TRL ``RewardTrainer``
    output): the copy that scores at evaluation or serving."""
    trained_dir: ConfigPath | None = None
    """The reward model as training used it (default: ``model_dir``): the scoring copy's
    tensors must be its tensors."""
    tokenizer: ConfigPath | None = None
    """The reward model's tokenizer (default: ``model_dir``)."""
    dtype: Dtype | None = None
    """The dtype the scoring copy is stored and run in, when lower than the trained one's."""
    training: RewardScoring = RewardScoring()
    """How training scored its samples."""
    serving: RewardScoring | None = None
    """How evaluation or serving scores (default: as training)."""
    function: str | None = None
    """``module:callable(prompts, completions, **kwargs) -> list[float]``: a reward function
    as GRPO trainers take it (a custom scorer serving the reward model, or another reward)."""
    function_matches_model: bool = True
    """With ``function`` and a reward model both set: the function serves the trained reward
    model's scores, and its rewards on the same samples must equal them (score difference and
    pair rankings flipped). ``false``: the function is another reward by design (a format or
    rule reward), not compared."""
    completions: str | None = None
    """JSONL, one ``{"prompt", "completion"}`` per line, or a rollout dump (``paritygate dump``
    JSONL/Parquet: ``prompt_ids``, ``completion_ids``, decoded by the training tokenizer), or
    ``generated`` (the HF engine's greedy continuations of the probes, shared with the other
    LM checks); default: each text probe split in two at a word boundary."""
    length_slope_max: float | None = Field(None, ge=0)
    """Fail when the score grows faster than this per completion token on length variants
    (default: reported, not judged)."""

    @model_validator(mode="after")
    def _something_to_score(self) -> RewardSpec:
        if self.model_dir is None and self.function is None:
            raise ValueError("a reward block needs model_dir, function or both")
        return self


class RoutingSpec(StrictModel):
    """``routing_agreement``: the experts a mixture-of-experts policy's engine routes each token
    to, against the trainer's. The block's presence says the model is an MoE: a model without
    MoE layers is then bad input, not a skip."""

    samples: bool = False
    """Also teacher-force the HF engine's sampled completions (``generation_samples`` per
    probe; one generation more unless ``logprob_delta`` already sampled them)."""
    dump_experts: bool = False
    """Every record of ``engine.dump`` must carry ``routed_experts``: the experts the engine
    routed each token to, audited against the trainer's recompute."""
    tie_margin: float | None = Field(None, gt=0, lt=1)
    """Relative router margin under which a flipped expert set is a near tie (default: the
    precision tier's, :data:`paritygate.metrics.routing.ROUTER_TIE_REL`)."""


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
    reference: ReferenceSpec | None = None
    """The KL reference model (``reference_parity``; skipped when absent)."""
    reward: RewardSpec | None = None
    """The reward model and/or function (``reward_parity``; skipped when absent)."""
    behaviour: BehaviourSpec | None = None
    """``behaviour_parity``'s settings; the check is skipped without them."""
    routing: RoutingSpec | None = None
    """``routing_agreement``'s settings (an MoE policy); without the block a dense model skips
    the check."""

    def tier(self, engine_dtype: str | None = None) -> str:
        """The precision tier key: the configured one, else ``<training>/<inference>``."""
        if self.precision_tier:
            return self.precision_tier
        from paritygate.metrics.tiers import tier_for

        return tier_for(self.training.dtype, engine_dtype or self.engine.dtype)[0]
