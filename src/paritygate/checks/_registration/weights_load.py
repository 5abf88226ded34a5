"""The registration of :mod:`paritygate.checks.weights_load` (which re-exports both): its
checklist ``POSITION`` and the root-cause edges it owns (``CAUSES``: the checkpoint's NaN/Inf,
tensors not loaded, the served copy's precision, completeness and adapters), kept in their own
file beside the check because the ten edges would take its module past 450 lines."""

from __future__ import annotations

from paritygate.causes import (
    DOWNSTREAM_LM,
    DOWNSTREAM_POLICY,
    Explanation,
    not_loaded_explains_provenance,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("weights_load", "nonfinite_checkpoint", ("nonfinite_checkpoint",),
                DOWNSTREAM_POLICY + DOWNSTREAM_LM + ("export_integrity", "reference_parity"),
                "the checkpoint's NaN/Inf tensors propagate into every output",
                fix="do not release this checkpoint: resume from the last finite one",
                rank=10),
    Explanation("weights_load", "served_precision_change",
                ("precision_change",),
                DOWNSTREAM_LM,
                "the served copy stores its weights in a lower precision than the gate judges",
                fix="declare the served dtype (causal_lm.serving.dtype) or serve the "
                    "full-precision weights",
                rank=30),
    Explanation("weights_load", "served_copy_incomplete",
                ("served_tensors_missing", "served_tensors_extra", "served_shape_mismatch"),
                DOWNSTREAM_LM,
                "the served copy is not this checkpoint's tensors",
                fix="re-export the serving copy from the checkpoint under test "
                    "(paritygate export CONFIG)",
                rank=40),
    Explanation("weights_load", "adapter_difference",
                ("adapter_difference",),
                DOWNSTREAM_LM,
                "the served copy differs from the checkpoint by a low-rank update of its "
                "projection weights (an adapter merged otherwise)",
                fix="merge the adapter the checkpoint was trained with into the served copy at "
                    "its training scale (peft: merge_and_unload under the training LoraConfig's "
                    "r and lora_alpha), or serve the checkpoint under test",
                rank=50),
    Explanation("weights_load", "adapter_not_merged",
                ("adapter_not_merged",),
                DOWNSTREAM_LM,
                "the served copy is the base model: the training adapter is not merged",
                fix="serve the base with the adapter merged (peft: PeftModel.from_pretrained("
                    "base, adapter).merge_and_unload(), then save_pretrained), or serve the "
                    "adapter through the engine's LoRA support",
                rank=60),
    Explanation("weights_load", "adapter_scale_differs",
                ("adapter_scale_differs",),
                DOWNSTREAM_LM,
                "the served copy applies the training adapter's B @ A at another scale than "
                "the declared lora_alpha / r (details.adapter_scale_differs.served_scale: 1 "
                "when lora_alpha / r was ignored, alpha'/r when lora_alpha was edited)",
                fix="re-merge the adapter once from the base at its training scale "
                    "(merge_and_unload under the adapter's own adapter_config.json)",
                rank=70),
    Explanation("weights_load", "adapter_on_other_base",
                ("adapter_on_other_base",),
                DOWNSTREAM_LM,
                "the served copy holds the training adapter's update over another base's "
                "weights",
                fix="merge the adapter into the base it was trained on (its adapter_config.json "
                    "base_model_name_or_path), and name that base as causal_lm.model_dir",
                rank=75),
    Explanation("weights_load", "adapter_mismatch",
                ("adapter_mismatch",),
                DOWNSTREAM_LM,
                "the served copy differs only on the adapter's target modules, by another "
                "update: another adapter was merged",
                fix="merge the adapter under test (causal_lm.adapter) into the served copy",
                rank=80),
    Explanation("weights_load", "stale_engine_weights",
                ("stale_served_weights",),
                DOWNSTREAM_LM,
                "the inference engine serves other weights than the checkpoint under test",
                fix="point the engine at the checkpoint under test",
                rank=90),
    Explanation("weights_load", "weights_not_loaded",
                ("wrapper_prefix", "key_renamed", "missing_keys", "unexpected_keys",
                 "shape_mismatch", "values_altered", "load_error"),
                DOWNSTREAM_POLICY + DOWNSTREAM_LM + ("export_integrity",),
                "part of the model runs on tensors the checkpoint did not provide "
                "(random init)",
                fix="save the state_dict under the model's key names (strip wrapper "
                    "prefixes) and load it strictly",
                only_if=(("export_integrity", not_loaded_explains_provenance),),
                rank=100),
    Explanation("weights_load", "weights_not_loaded",
                ("checkpoint_coverage",),
                ("precision_per_layer",),
                "the model's tensors are not all the checkpoint's, and precision is never "
                "measured on such a model",
                fix="gate a complete save, loaded by the model class it was saved from",
                rank=110),
)

POSITION = 10
"""The check's place in the checklist (and in every report): the registry sorts by it."""
