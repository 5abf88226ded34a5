"""The registration of :mod:`paritygate.checks.logits_agreement` (which re-exports both): its
checklist ``POSITION`` and the root-cause edges it owns (``CAUSES``: a served output of another
shape, the action transform, a target network served, an artifact whose outputs differ), kept
beside the check so its module stays under 450 lines."""

from __future__ import annotations

from paritygate import causes

CAUSES: tuple[causes.Explanation, ...] = (
    causes.Explanation(
        "logits_agreement", "served_output_shape", ("output_shape",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "batch_invariance", "serving_replay"),
        "the artifact serves an output of another shape than the training policy output (another "
        "head, such as the value head, or another action count)",
        fix="export the output policy.policy_output names (the actor's logits or mean), "
            "under the name the artifact declares",
        rank=175),
    causes.Explanation(
        "logits_agreement", "action_transform",
        ("squash_missing", "action_scale_missing", "action_bias_missing",
         "action_clip_differs", "log_std_clamp_differs"),
        ("head_removal", "batchnorm_export", "export_integrity", "precision_per_layer",
         "rollout_parity"),
        "the serving side turns the policy output (a Gaussian's mean or a deterministic "
        "actor's) into actions differently from training (policy.distribution)",
        fix="apply the declared squash (clip bounds), action scale and bias and log_std clamp "
            "in the served actor, or declare what it serves in policy.distribution",
        only_if=causes.ROLLOUT, rank=180),
    causes.Explanation(
        "logits_agreement", "target_network_served", ("target_network_served",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity"),
        causes.TARGET_SERVED, fix=causes.TARGET_SERVED_FIX,
        only_if=(("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT),
        rank=230),
    causes.Explanation(
        "logits_agreement", "normaliser_missing", ("normaliser_missing",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "serving_replay", "batch_invariance"),
        "the artifact computes the network on raw observations: the training model's "
        "observation normaliser is not applied in it (a preprocessing fault)",
        fix="export the module whose forward applies the normaliser (its mean and variance "
            "buffers stored and used), or apply the same normalisation in serving "
            "preprocessing (policy.preprocessing.serving) and export the network alone",
        only_if=(("export_integrity", causes.same_output_gap),
                 ("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT,
                 *causes.REPLAY),
        rank=235),
    causes.Explanation(
        "logits_agreement", "artifact_outputs_differ",
        ("stale_artifact", "artifact_outputs_differ", "undeclared_precision"),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "serving_replay"),
        "the artifact's outputs differ from torch eval (measured by logits_agreement)",
        fix=causes.REEXPORT_FIX,
        only_if=(("export_integrity", causes.same_output_gap),
                 ("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT,
                 *causes.REPLAY),
        breaches=("max_abs_diff",), rank=240),
)

POSITION = 80
"""The check's place in the checklist (and in every report): the registry sorts by it."""
