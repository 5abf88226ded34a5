"""Registry of checks, one module per check id, imported lazily."""

from __future__ import annotations

import importlib

from paritygate.check import CheckSpec

CHECK_IDS: tuple[str, ...] = (
    "weights_load",
    "batchnorm_export",
    "head_removal",
    "dropout_off",
    "preprocessing_parity",
    "tokenizer_parity",
    "sampling_config",
    "logits_agreement",
    "recurrent_parity",
    "export_integrity",
    "precision_per_layer",
    "logprob_impl",
    "logprob_delta",
    "vllm_delta",
    "generation_parity",
    "batch_invariance",
    "behaviour_parity",
    "rollout_parity",
    "reward_parity",
    "reference_parity",
    "serving_replay",
)


def get_check(check_id: str) -> CheckSpec:
    """Return the spec of ``check_id`` (KeyError for an unknown id)."""
    if check_id not in CHECK_IDS:
        raise KeyError(check_id)
    module = importlib.import_module(f"paritygate.checks.{check_id}")
    spec: CheckSpec = module.CHECK
    return spec


def checks_for(family: str) -> list[CheckSpec]:
    """All checks that apply to a model family, in checklist order."""
    return [spec for cid in CHECK_IDS if family in (spec := get_check(cid)).families]
