"""Known sampling fields ``sampling_config`` reads but does not compare, with the reason each
is left out (listed in its report)."""

from __future__ import annotations

NOT_COMPARED: dict[str, str] = {
    # HF GenerationConfig fields that change decoding but have no counterpart here.
    **{
        name: "HF decoding option outside the RL sampling protocol"
        for name in (
            "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h", "num_beams",
            "num_beam_groups", "diversity_penalty", "length_penalty", "early_stopping",
            "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
            "encoder_repetition_penalty", "bad_words_ids", "force_words_ids", "constraints",
            "renormalize_logits", "suppress_tokens", "begin_suppress_tokens",
            "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty",
            "sequence_bias", "guidance_scale", "penalty_alpha", "dola_layers",
            "watermarking_config", "token_healing", "remove_invalid_values", "max_length",
            "min_length", "max_time", "low_memory",
        )
    },
    **{
        name: "HF execution option: does not change the sampled distribution"
        for name in (
            "cache_implementation", "cache_config", "max_cache_len", "compile_config",
            "disable_compile", "prefill_chunk_size", "continuous_batching_config",
            "assistant_confidence_threshold", "assistant_early_exit",
            "assistant_ensemble_weight", "assistant_lookbehind", "is_assistant",
            "max_matching_ngram_size", "num_assistant_tokens",
            "num_assistant_tokens_schedule", "prompt_lookup_num_tokens", "speculation_type",
            "target_lookbehind", "use_mtp",
        )
    },
    # vLLM SamplingParams fields that change the output but are not modelled here.
    **{
        name: "vLLM sampling option outside the RL sampling protocol"
        for name in (
            "best_of", "logit_bias", "allowed_token_ids", "bad_words", "guided_decoding",
            "structured_outputs", "logits_processors", "truncate_prompt_tokens",
            "include_stop_str_in_output",
        )
    },
    **{
        name: "vLLM output option: does not change the sampled tokens"
        for name in (
            "skip_special_tokens", "spaces_between_special_tokens", "detokenize",
            "output_kind", "extra_args",
        )
    },
}
"""Known fields that ``sampling_config`` lists in its report as not compared."""

OFF_POLICY: dict[str, object] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_new_tokens": 0,
    "min_length": 0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "bad_words_ids": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "logits_processors": None,
    "guided_decoding": None,
    "structured_outputs": None,
}
"""Fields that move the served distribution away from the policy's softmax (penalties, biases,
banned or forced tokens, a minimum length, truncations other than temperature/top-k/top-p/
min-p), with each one's neutral value: a field set to anything else samples off-policy even
when both sides agree, unless the trainer's log-prob function applies the same transform
(``causal_lm.training.logprob_applies``)."""


def is_neutral(name: str, value: object) -> bool:
    """``value`` leaves the distribution as the field's neutral value does (empty lists,
    mappings and ``None`` are all neutral for the list/mapping fields)."""
    neutral = OFF_POLICY.get(name)
    if value is None or value == neutral:
        return True
    if neutral is None:
        return isinstance(value, (list, dict, tuple)) and not value
    try:
        return float(value) == float(neutral)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False

NO_EOS = "{} states no eos_token_id: HF generate stops on no EOS token"
"""Where an HF generation_config.json without ``eos_token_id`` leaves the EOS ids (none: HF
``generate`` stops only on the file's ids; vLLM stops on the tokenizer's EOS regardless)."""
