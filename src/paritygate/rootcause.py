"""One fault, one root cause: which failing check's finding explains the others.

A single fault usually fails several checks: a checkpoint saved with DDP's
``module.`` prefix fails ``weights_load`` and then every check that ran on the
random-init tensors left behind. :func:`explain` walks a declared explanation
graph (:data:`GRAPH`: a failing check, the kinds of its findings that identify the
fault, and the checks that fault makes fail too) over a run's results and

* names the root cause (``RootCause``: the check, the finding kind, its message);
* marks each consequential failure with ``consequence_of`` and rewrites its message
  to ``see <check>: <why>``, followed by its own measurement (the metrics stay), so
  it no longer offers its own guess.

It is a pure function over ``CheckResult`` records (copies are returned) and runs
after the verdict: statuses never change, only how the failures are explained. It
decides from the records' kinds (``(check, finding kind)``) and measured values,
never from message text, so a message can be reworded freely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paritygate.result import CheckResult, Reason

FAILED = ("fail", "error")


@dataclass(frozen=True)
class Explanation:
    """An edge set of the graph: ``check``'s finding of one of ``finding_kinds`` (the root-cause
    ``kind`` it identifies) explains ``explains``."""

    check: str
    kind: str
    finding_kinds: tuple[str, ...] | None
    """Finding kinds of ``check`` that identify the fault; ``None``: any failed rule of the
    check (a finding, breach, regression or non-finite metric) does."""
    explains: tuple[str, ...]
    why: str
    """Why the explained checks fail too (one clause, written into their messages)."""
    fix: str | None = None
    """The likely fix of the root finding, shown with the root cause."""
    only_if: tuple[tuple[str, Callable[[CheckResult, CheckResult], bool]], ...] = ()
    """Explained checks linked only when ``test(root, consequence)`` holds: decided from
    what the consequence measured (checks absent here are linked whenever they fail)."""
    breaches: tuple[str, ...] = ()
    """Metrics of ``check`` whose plain threshold breach (no finding) also identifies the edge,
    but only where it explains a failing consequence: the consequence measured the same thing
    (a lone breach stays ``threshold_breach``)."""

    regressed: tuple[str, ...] = ()
    """Metrics whose golden regression identifies the fault (a digest that changed between
    checkpoints); an edge with these matches on them instead of on findings."""

    def links(self, root: CheckResult, consequence: CheckResult) -> bool:
        test = dict(self.only_if).get(consequence.id)
        return test is None or bool(test(root, consequence))


# --- what a consequence measured: does the root's finding account for it? -----------------------


def _failed_only(consequence: CheckResult, allowed: Callable[[str], bool]) -> bool:
    """Every breached metric is one the root accounts for, and no own finding is extra."""
    failed = consequence.failed_metrics
    return bool(failed) and all(allowed(name) for name in failed)


def _provenance_only(consequence: CheckResult) -> bool:
    """export_integrity failed only because the artifact's outputs differ from torch's."""
    return _failed_only(consequence, lambda n: n == "provenance_max_abs_diff")


def _declared_outputs_only(root: CheckResult, c: CheckResult) -> bool:
    """export_integrity failed only on its declared outputs after the first."""
    return _failed_only(c, lambda n: n == "declared_outputs_differ")


def _not_loaded_explains_provenance(root: CheckResult, c: CheckResult) -> bool:
    """The artifact carries the checkpoint's tensors; the inference model does not."""
    inits = c.details.get("initializers") or {}
    return _provenance_only(c) and bool(inits.get("not_in_model"))


def _bn_stats_explain_provenance(root: CheckResult, c: CheckResult) -> bool:
    """Only BatchNorm statistics initializers differ from the checkpoint's."""
    inits = c.details.get("initializers") or {}
    unmatched = inits.get("unmatched") or []
    return _provenance_only(c) and not inits.get("misplaced") and all(
        n.endswith((".running_mean", ".running_var")) for n in unmatched)


def _same_output_gap(root: CheckResult, c: CheckResult) -> bool:
    """export_integrity measured the gap logits_agreement names (every initializer matches)."""
    inits = c.details.get("initializers") or {}
    gap, own = root.metrics.get("max_abs_diff"), c.metrics.get("provenance_max_abs_diff")
    return (_provenance_only(c) and not inits.get("unmatched")
            and isinstance(gap, float) and isinstance(own, float)
            and abs(gap - own) <= 1e-6 + 1e-3 * abs(gap))


def _artifact_tier_only(root: CheckResult, c: CheckResult) -> bool:
    """precision_per_layer failed only its ONNX tier: artifact vs torch, the root's gap."""
    return _failed_only(c, lambda n: n.startswith("onnx/"))


def _no_layer_over_budget(root: CheckResult, c: CheckResult) -> bool:
    """Output error without a layer over its budget: the forward differs run to run."""
    return _failed_only(c, lambda n: n.endswith("output_rel_l2"))


_ACTING = {"action_divergence": "unexcused_divergences", "nonfinite_action": "nonfinite_actions"}
"""rollout_parity's findings about the actions taken, each with the metric it breaches."""


def _actions_differ(root: CheckResult, c: CheckResult) -> bool:
    """rollout_parity failed only by the actions it took (diverging, or NaN/Inf), never by
    returns or trajectories that differ under agreeing actions (the root does not explain
    an environment that is not reproducible)."""
    kinds = c.finding_kinds()
    return bool(kinds) and all(k in _ACTING for k in kinds) and _failed_only(
        c, lambda n: n in _ACTING.values())


_TARGET_SERVED = ("the artifact was built from the target network, a training-only copy of "
                  "the policy")
_TARGET_SERVED_FIX = ("export the online network (the policy the checkpoint acts with), not its "
                      "target copy")
"""Why and fix of ``target_network_served``, named by export_integrity or, when it did not run,
logits_agreement."""


_ROLLOUT = (("rollout_parity", _actions_differ),)
"""The artifact-side and preprocessing roots explain a rollout's actions only."""


def _replayed_outputs_differ(root: CheckResult, c: CheckResult) -> bool:
    """serving_replay failed only by what serving computed (its preprocessed inputs or its
    outputs), never by a log the probes do not cover or an empty one."""
    kinds = c.finding_kinds()
    return bool(kinds) and set(kinds) <= {"serving_preprocessing_differs", "served_outputs_differ"}


_REPLAY = (("serving_replay", _replayed_outputs_differ),)
"""A root on the serving path explains the served records that differ from the replay."""

_DOWNSTREAM_POLICY = ("batchnorm_export", "head_removal", "dropout_off", "logits_agreement",
                      "precision_per_layer", "recurrent_parity", "rollout_parity")
_DOWNSTREAM_LM = ("logits_agreement", "logprob_delta", "vllm_delta", "generation_parity",
                  "precision_per_layer", "batch_invariance")

GRAPH: tuple[Explanation, ...] = (
    # Earlier edges win: a check explained by one edge is never the root of a later one.
    Explanation("weights_load", "nonfinite_checkpoint", ("nonfinite_checkpoint",),
                _DOWNSTREAM_POLICY + _DOWNSTREAM_LM + ("export_integrity", "reference_parity"),
                "the checkpoint's NaN/Inf tensors propagate into every output",
                fix="do not release this checkpoint: resume from the last finite one"),
    Explanation("head_removal", "structure_mismatch",
                ("foreign_parameters",),
                ("weights_load",),
                "the inference model's structure differs, so its keys do not match the "
                "checkpoint"),
    Explanation("weights_load", "served_precision_change",
                ("precision_change",),
                _DOWNSTREAM_LM,
                "the served copy stores its weights in a lower precision than the gate judges",
                fix="declare the served dtype (causal_lm.serving.dtype) or serve the "
                    "full-precision weights"),
    Explanation("weights_load", "served_copy_incomplete",
                ("served_tensors_missing", "served_tensors_extra", "served_shape_mismatch"),
                _DOWNSTREAM_LM,
                "the served copy is not this checkpoint's tensors",
                fix="re-export the serving copy from the checkpoint under test "
                    "(paritygate export CONFIG)"),
    Explanation("weights_load", "adapter_difference",
                ("adapter_difference",),
                _DOWNSTREAM_LM,
                "the served copy differs from the checkpoint by a low-rank update of its "
                "projection weights (an adapter merged otherwise)",
                fix="merge the adapter the checkpoint was trained with into the served copy at "
                    "its training scale (peft: merge_and_unload under the training LoraConfig's "
                    "r and lora_alpha), or serve the checkpoint under test"),
    Explanation("weights_load", "adapter_not_merged",
                ("adapter_not_merged",),
                _DOWNSTREAM_LM,
                "the served copy is the base model: the training adapter is not merged",
                fix="serve the base with the adapter merged (peft: PeftModel.from_pretrained("
                    "base, adapter).merge_and_unload(), then save_pretrained), or serve the "
                    "adapter through the engine's LoRA support"),
    Explanation("weights_load", "adapter_scale",
                ("adapter_scale",),
                _DOWNSTREAM_LM,
                "the served copy holds the training adapter's update at another scale (c in "
                "details.adapter_scale: r/alpha when lora_alpha / r was ignored, 2 when it was "
                "merged twice)",
                fix="re-merge the adapter once from the base at its training scale "
                    "(merge_and_unload under the adapter's own adapter_config.json)"),
    Explanation("weights_load", "adapter_mismatch",
                ("adapter_mismatch",),
                _DOWNSTREAM_LM,
                "the served copy differs only on the adapter's target modules, by another "
                "update: another adapter was merged",
                fix="merge the adapter under test (causal_lm.adapter) into the served copy"),
    Explanation("weights_load", "stale_engine_weights",
                ("stale_served_weights",),
                _DOWNSTREAM_LM,
                "the inference engine serves other weights than the checkpoint under test",
                fix="point the engine at the checkpoint under test"),
    Explanation("weights_load", "weights_not_loaded",
                ("wrapper_prefix", "key_renamed", "missing_keys", "unexpected_keys",
                 "shape_mismatch", "values_altered", "load_error"),
                _DOWNSTREAM_POLICY + _DOWNSTREAM_LM + ("export_integrity",),
                "part of the model runs on tensors the checkpoint did not provide "
                "(random init)",
                fix="save the state_dict under the model's key names (strip wrapper "
                    "prefixes) and load it strictly",
                only_if=(("export_integrity", _not_loaded_explains_provenance),)),
    Explanation("weights_load", "weights_not_loaded",
                ("checkpoint_coverage",),
                ("precision_per_layer",),
                "the model's tensors are not all the checkpoint's, and precision is never "
                "measured on such a model",
                fix="gate a complete save, loaded by the model class it was saved from"),
    Explanation("export_integrity", "undeclared_precision",
                ("undeclared_precision",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact stores its weights in a lower precision than the config "
                "declares, so its outputs are held to the float32 limits",
                fix="declare the artifact's precision (policy.artifact_dtype) or export it "
                    "in float32",
                only_if=_ROLLOUT),
    Explanation("export_integrity", "stale_artifact",
                ("stale_manifest", "artifact_modified", "not_from_checkpoint"),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact was not exported from the checkpoint under test",
                fix="re-export the artifact from the gated checkpoint "
                    "(paritygate export CONFIG)",
                only_if=_ROLLOUT),
    Explanation("export_integrity", "target_network_served", ("target_network_served",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                _TARGET_SERVED, fix=_TARGET_SERVED_FIX,
                only_if=_ROLLOUT),
    Explanation("export_integrity", "misplaced_tensor", ("misplaced_tensor",),
                ("logits_agreement", "batchnorm_export", "precision_per_layer", "rollout_parity"),
                "the artifact carries a checkpoint tensor in another layer's place",
                fix="load the state_dict into the export model by key name, strictly, "
                    "and re-export",
                only_if=(("precision_per_layer", _artifact_tier_only), *_ROLLOUT)),
    Explanation("export_integrity", "batch_axis", ("batch_axis_baked", "batch_sizes_fail"),
                ("batchnorm_export", "logits_agreement"),
                "the artifact only runs at its baked batch size",
                fix="export with a dynamic batch axis"),
    Explanation("head_removal", "undeclared_outputs", ("undeclared_outputs",),
                ("export_integrity", "logits_agreement"),
                "a training head was exported with the policy",
                fix="export only the inference model's declared outputs"),
    Explanation("logits_agreement", "action_transform",
                ("squash_missing", "action_scale_missing", "action_bias_missing",
                 "action_clip_differs", "log_std_clamp_differs"),
                ("head_removal", "batchnorm_export", "export_integrity", "precision_per_layer",
                 "rollout_parity"),
                "the serving side turns the policy output (a Gaussian's mean or a "
                "deterministic actor's) into actions differently from training "
                "(policy.distribution)",
                fix="apply the declared squash (clip bounds), action scale and bias and "
                    "log_std clamp in the served actor, or declare what it serves in "
                    "policy.distribution",
                only_if=_ROLLOUT),
    Explanation("head_removal", "step_removed", ("step_removed",),
                ("batchnorm_export", "logits_agreement", "rollout_parity"),
                "the inference model lacks a step of the training forward", only_if=_ROLLOUT),
    Explanation("batchnorm_export", "training_mode_export",
                ("training_mode_export",),
                ("dropout_off", "logits_agreement", "head_removal", "export_integrity",
                 "precision_per_layer", "rollout_parity", "batch_invariance"),
                "the artifact was exported in training mode",
                fix="call model.eval() before exporting",
                only_if=(("export_integrity", _bn_stats_explain_provenance),
                         ("precision_per_layer", _artifact_tier_only), *_ROLLOUT)),
    Explanation("batchnorm_export", "stats_reset",
                ("stats_missing", "default_stats", "stats_mismatch", "stats_reset"),
                ("logits_agreement", "export_integrity", "precision_per_layer", "rollout_parity"),
                "the artifact normalises with other BatchNorm statistics than the checkpoint's",
                only_if=(("export_integrity", _bn_stats_explain_provenance),
                         ("precision_per_layer", _artifact_tier_only), *_ROLLOUT)),
    Explanation("dropout_off", "nondeterministic",
                ("training_modules", "torch_nondeterministic", "artifact_nondeterministic",
                 "random_operators"),
                ("head_removal", "batchnorm_export", "logits_agreement", "precision_per_layer",
                 "rollout_parity"),
                "randomness in the forward changes every output it feeds",
                fix="put the model in eval mode before exporting or serving (no dropout or "
                    "sampling on the inference path)",
                only_if=(("precision_per_layer", _no_layer_over_budget), *_ROLLOUT)),
    Explanation("logits_agreement", "target_network_served", ("target_network_served",),
                ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity"),
                _TARGET_SERVED, fix=_TARGET_SERVED_FIX,
                only_if=(("precision_per_layer", _artifact_tier_only), *_ROLLOUT)),
    Explanation("logits_agreement", "artifact_outputs_differ",
                ("stale_artifact", "artifact_outputs_differ", "undeclared_precision"),
                ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
                 "serving_replay"),
                "the artifact's outputs differ from torch eval (measured by logits_agreement)",
                only_if=(("export_integrity", _same_output_gap),
                         ("precision_per_layer", _artifact_tier_only), *_ROLLOUT, *_REPLAY),
                breaches=("max_abs_diff",)),
    Explanation("recurrent_parity", "recurrent_state",
                ("state_missing", "state_shape", "state_swapped", "state_outputs_differ",
                 "missing_reset", "wrong_initial_state", "sequence_outputs_differ"),
                ("export_integrity", "rollout_parity"),
                "the artifact carries the recurrent state differently from the training model "
                "(named by recurrent_parity)",
                fix="export the new state in the declared order and per-row layout (batch on "
                    "axis 0), reset to the initial state on the episode-start input",
                only_if=(("export_integrity", _declared_outputs_only), *_ROLLOUT)),
    Explanation("batch_invariance", "batch_statistics_in_serving",
                ("preprocessing_batch_dependent",),
                ("preprocessing_parity", "rollout_parity", "serving_replay"),
                "serving preprocessing normalises each row with its batch's statistics",
                fix="normalise with fixed statistics (the training run's), never the batch's",
                only_if=(*_ROLLOUT, *_REPLAY)),
    Explanation("preprocessing_parity", "preprocessing_mismatch", None,
                ("rollout_parity", "serving_replay"),
                "the serving preprocessing feeds the artifact other model inputs than the "
                "training preprocessing feeds the trainer",
                only_if=(*_ROLLOUT, *_REPLAY)),
    Explanation("logprob_impl", "logprob_recompute", None,
                ("logprob_delta",),
                "the trainer's log-prob recompute is wrong, so its deltas to the engine are too"),
    Explanation("logprob_delta", "pinned_tier_mismatch", ("precision_mismatch",),
                ("logits_agreement", "generation_parity", "batch_invariance"),
                "the engine computes in another precision than the pinned tier judges",
                fix="pin the served precision's tier (causal_lm.precision_tier) or serve in "
                    "the pinned precision"),
    *(Explanation(check, "serving_file_contradicts_served_dir",
                  ("serving_file_contradicts_served_dir",), explains,
                  "a serving file the config declares is not the one the served directory "
                  "ships, so the gate judged a serving setup that does not ship",
                  fix="remove the declared serving path (the served directory's own file is "
                      "the default), or ship the declared file")
      for check, explains in (
          ("tokenizer_parity",
           ("sampling_config", "logprob_delta", "vllm_delta", "generation_parity")),
          ("sampling_config",
           ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement")))),
    Explanation("tokenizer_parity", "tokenizer", None,
                ("sampling_config", "logprob_delta", "vllm_delta", "generation_parity",
                 "batch_invariance"),
                "the serving tokenizer encodes prompts differently from training",
                fix="ship the training tokenizer's files with the served copy (left padding for "
                    "generation, the same special tokens and chat template), or accept a "
                    "difference with a reason: causal_lm.tokenizer.allow: [{field, reason}]"),
    Explanation("batch_invariance", "batch_layout",
                ("right_padding", "position_ids_not_from_mask", "mask_not_passed"),
                ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement"),
                "the engine lays batches out so that a row's numbers depend on its batch-mates",
                fix="left-pad batches, pass the attention mask and count position ids from it"),
    Explanation("sampling_config", "sampling_protocol", None,
                ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement",
                 "behaviour_parity"),
                "training and serving sample under different settings",
                fix="make the serving sampling config's differing fields equal the training "
                    "ones (the served directory's generation_config.json is the serving "
                    "default), or accept one with a reason: causal_lm.sampling.allow: "
                    "[{field, reason}]"),
    # The RL loop's reward and KL reference: their faults explain no other check; each kind
    # names what is wrong with them.
    Explanation("reward_parity", "reward_provenance",
                ("stale_reward_model", "reward_precision_undeclared"), (),
                "the scoring reward model is not the trained one's tensors",
                fix="score with the trained reward model's checkpoint (or declare its dtype: "
                    "causal_lm.reward.dtype)"),
    Explanation("reward_parity", "reward_read_position",
                ("pad_token_missing", "score_read_at_pad"), (),
                "the reward model reads its score at a pad, not the last real token",
                fix="save the reward model with config.pad_token_id = the tokenizer's pad id"),
    Explanation("reward_parity", "reward_scoring_layout",
                ("padding_side_differs", "truncation_differs", "scored_span_differs",
                 "chat_template_differs", "eos_differs"), (),
                "serving feeds the reward model other text than training scored",
                fix="score at serving with training's padding side, max length, truncation "
                    "side, span, chat template and EOS"),
    Explanation("reward_parity", "reward_invariance", ("padding_variance", "batch_variance"), (),
                "the reward depends on the padding or the batch it is scored in"),
    Explanation("reward_parity", "reward_length", ("length_slope",), (),
                "the reward grows with completion length",
                fix="read the score at the last real token, not pooled over positions"),
    Explanation("reference_parity", "reference_drift", (), (),
                "the KL reference changed between two checkpoints of one policy",
                fix="restore the frozen initial policy as the KL reference, then re-bless",
                regressed=("reference_digest",)),
    Explanation("reference_parity", "reference_is_policy", ("reference_is_policy",), (),
                "the KL reference is the policy under test",
                fix="point causal_lm.reference.model_dir at the frozen initial policy"),
    Explanation("reference_parity", "reference_provenance",
                ("reference_not_initial", "reference_precision_undeclared",
                 "nonfinite_reference"), (),
                "the KL reference is not the initial policy's tensors",
                fix="load the KL reference from the initial policy's checkpoint (or declare "
                    "its dtype: causal_lm.reference.dtype)"),
    Explanation("reference_parity", "reference_logprobs",
                ("reference_logprobs_shape", "reference_mask_ignored", "reference_pads_scored",
                 "reference_logprobs_differ"), (),
                "the trainer scores the KL reference differently from the gate's recompute",
                fix="pass attention_mask and position_ids to the reference forward and zero "
                    "pad targets"),
    Explanation("reference_parity", "kl_estimator",
                ("kl_estimator_shape", "kl_sign_flipped", "kl_arguments_swapped",
                 "kl_estimator_wrong"), (),
                "the trainer's KL estimator does not estimate KL(policy || reference)",
                fix="per token, with r = logp_ref - logp: k3 = exp(r) - r - 1 (or k1 = -r)"),
)


@dataclass(frozen=True)
class RootCause:
    """The failure that explains the run: reported first everywhere."""

    check: str
    kind: str
    message: str
    explains: tuple[str, ...] = ()
    fix: str | None = None
    finding: str | None = None
    """The root check's first finding kind (``missing_reset``, ``squash_missing``), ``None``
    when it failed by a threshold, a regression or a NaN only: what other code acts on when no
    edge of the graph names the fault (``kind`` is then ``independent``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "kind": self.kind,
            "message": self.message,
            "explains": list(self.explains),
            "fix": self.fix,
            "finding": self.finding,
        }


def _findings(result: CheckResult) -> list[Reason]:
    """What the check found wrong: its reasons less a missing baseline (not a finding)."""
    return [r for r in result.reasons if r.kind != "no_golden"]


def _baseline_only(result: CheckResult) -> bool:
    """Failed only by being worse than (or changed from) its baseline: nothing is wrong on this
    run alone. A check with a finding or a threshold breach is the likelier root cause."""
    found = _findings(result)
    return bool(found) and all(r.kind == "regression" for r in found)


def _matches(result: CheckResult, edge: Explanation) -> str | None:
    """``"finding"`` when the root failed by one of the edge's finding kinds (any failed rule
    for ``None``), ``"breach"`` when only by a plain breach of one of its ``breaches``."""
    found = _findings(result)
    if edge.regressed:
        hit = any(r.kind == "regression" and r.metric in edge.regressed for r in found)
        return "finding" if hit else None
    if edge.finding_kinds is None:
        return "finding" if found or not result.reasons else None
    if any(r.kind == "finding" and r.finding in edge.finding_kinds for r in found):
        return "finding"
    plain = not any(r.kind == "finding" for r in found)
    if plain and any(r.kind == "breach" and r.metric in edge.breaches for r in found):
        return "breach"
    return None


def _plain_breach(result: CheckResult) -> bool:
    """Failed by a threshold breach and no finding: nothing names a cause but the numbers."""
    found = _findings(result)
    return any(r.kind == "breach" for r in found) and not any(r.kind == "finding" for r in found)


def _own_measurement(result: CheckResult) -> str:
    """The consequence's own numbers, without its guess at a cause."""
    names = list(result.failed_metrics) or ([result.key_metric] if result.key_metric else [])
    parts = []
    for name in names[:2]:
        value = result.metrics.get(name)
        text = f"{name} {_fmt(value)}"
        if name in result.thresholds:
            text += f" (threshold {_fmt(result.thresholds[name])})"
        parts.append(text)
    return f" Measured here: {', '.join(parts)}." if parts else ""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def explain(
    results: list[CheckResult], graph: tuple[Explanation, ...] = GRAPH
) -> tuple[list[CheckResult], RootCause | None]:
    """Results with consequential failures marked and reworded, plus the run's root cause.

    ``None`` when nothing failed. Without a matching edge the first failing check
    is the root cause (kind ``"threshold_breach"`` when it failed by thresholds and named no
    cause, else ``"independent"``), a check that failed only against its
    baseline coming after one with a finding or a threshold breach. Idempotent: results
    already marked keep their messages.
    """
    failing = {r.id: r for r in results if r.status in FAILED}
    if not failing:
        return [dataclasses.replace(r) for r in results], None
    by: dict[str, tuple[str, Explanation]] = {
        r.id: (r.consequence_of, Explanation(r.consequence_of, "", (), (), ""))
        for r in failing.values() if r.consequence_of
    }
    matched: dict[str, Explanation] = {}  # check -> edge of its first matching finding
    roots: set[str] = set()  # checks that explain another: never a consequence themselves
    # A failure with nothing found but a missing baseline neither explains nor is explained.
    linkable = {cid: r for cid, r in failing.items() if not r.reasons or _findings(r)}
    for edge in graph:
        root = linkable.get(edge.check)
        if root is None or root.status != "fail" or root.id in by:
            continue
        how = _matches(root, edge)
        if how is None:
            continue
        linked = False
        for cid in edge.explains:
            if (cid in linkable and cid not in by and cid not in roots and cid != root.id
                    and edge.links(root, linkable[cid])):
                by[cid] = (root.id, edge)
                roots.add(root.id)
                linked = True
        if how == "finding" or linked:
            matched.setdefault(root.id, edge)
    out: list[CheckResult] = []
    for r in results:
        r = dataclasses.replace(r)
        if r.id in by and not r.consequence_of:
            root_id, edge = by[r.id]
            r.consequence_of = root_id
            r.message = f"see {root_id}: {edge.why}.{_own_measurement(r)}"
            r.cause = r.message
            r.fix = failing[root_id].fix
        out.append(r)
    unexplained = [r for r in results if r.id in failing and r.id not in by]
    first = next((r for r in unexplained if r.id in linkable and not _baseline_only(r)), None)
    first = first or next((r for r in unexplained if r.id in linkable), None)
    if first is None:  # only missing baselines, or a cycle in stored results
        first = unexplained[0] if unexplained else next(r for r in results if r.id in failing)
    explained_ids = tuple(cid for cid, (root, _) in by.items() if root == first.id)
    root_edge = matched.get(first.id)
    if root_edge is not None:
        kind, edge_fix = root_edge.kind, root_edge.fix
    elif first.id not in linkable:
        kind, edge_fix = "no_golden", None
    else:
        kind, edge_fix = ("threshold_breach" if _plain_breach(first) else "independent"), None
    finding = next(iter(first.finding_kinds()), None)
    root_cause = RootCause(
        first.id, kind, first.message, tuple(c for c in failing if c in explained_ids),
        first.fix or edge_fix, finding,
    )
    return out, root_cause


def ordered(results: list[CheckResult], root: RootCause | None) -> list[CheckResult]:
    """Report order: the root cause, other independent failures, their consequences,
    then passing and skipped checks (run order within each group)."""
    def rank(r: CheckResult) -> int:
        if root is not None and r.id == root.check:
            return 0
        if r.status in FAILED:
            return 2 if r.consequence_of else 1
        return 3 if r.status == "pass" else 4

    return sorted(results, key=rank)
