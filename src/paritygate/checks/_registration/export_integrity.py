"""The registration of :mod:`paritygate.checks.export_integrity` (which re-exports both): its
checklist ``POSITION`` and the root-cause edges it owns (``CAUSES``: a stale or modified artifact,
a target network served, undeclared outputs), kept beside the check so its module stays under
450 lines."""

from __future__ import annotations

from paritygate.causes import (
    ROLLOUT,
    TARGET_SERVED,
    TARGET_SERVED_FIX,
    Explanation,
    artifact_tier_only,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("export_integrity", "undeclared_precision",
                ("undeclared_precision",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact stores its weights in a lower precision than the config "
                "declares, so its outputs are held to the float32 limits",
                fix="declare the artifact's precision (policy.artifact_dtype) or export it "
                    "in float32",
                only_if=ROLLOUT,
                rank=120),
    Explanation("export_integrity", "stale_artifact",
                ("stale_manifest", "artifact_modified", "not_from_checkpoint"),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact was not exported from the checkpoint under test",
                fix="re-export the artifact from the gated checkpoint "
                    "(paritygate export CONFIG)",
                only_if=ROLLOUT,
                rank=130),
    Explanation("export_integrity", "target_network_served", ("target_network_served",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                TARGET_SERVED, fix=TARGET_SERVED_FIX,
                only_if=ROLLOUT,
                rank=140),
    Explanation("export_integrity", "misplaced_tensor", ("misplaced_tensor",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact carries a checkpoint tensor in another layer's place",
                fix="load the state_dict into the export model by key name, strictly, "
                    "and re-export",
                only_if=(("precision_per_layer", artifact_tier_only), *ROLLOUT),
                rank=150),
    Explanation("export_integrity", "batch_axis", ("batch_axis_baked", "batch_sizes_fail"),
                ("batchnorm_export", "logits_agreement"),
                "the artifact only runs at its baked batch size",
                fix="export with a dynamic batch axis",
                rank=160),
)

POSITION = 100
"""The check's place in the checklist (and in every report): the registry sorts by it."""
