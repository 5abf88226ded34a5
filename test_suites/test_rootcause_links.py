"""Links of the explanation graph decided from what the consequence measured.

The records mirror reports of real faults: a root's finding explains a consequence only when
the consequence's own metrics and details say the root accounts for them.
"""

from __future__ import annotations

from typing import Any

from paritygate.result import NO_GOLDEN, CheckResult, Reason
from paritygate.rootcause import explain


def _failing(cid: str, kind: str | None, message: str, failed: dict[str, float],
             **details: Any) -> CheckResult:
    """A failed check: by a finding of ``kind``, or (``None``) by its first metric's breach."""
    reason = (Reason("finding", message, finding=kind) if kind is not None
              else Reason("breach", message, next(iter(failed))))
    return CheckResult(cid, "fail", message, dict(failed), None, dict.fromkeys(failed, 1e-5),
                       key_metric=next(iter(failed)), details=details, reasons=[reason],
                       failed_metrics=list(failed))


def _inits(**over: Any) -> dict[str, Any]:
    base = {"comparable": 12, "matched": 12, "folded": 0, "unmatched": [], "misplaced": {},
            "drifted": [], "max_rel_drift": 0.0, "not_in_model": []}
    return {**base, **over}


def _provenance(diff: float, inits: dict[str, Any]) -> CheckResult:
    return _failing("export_integrity", "provenance_unproven",
                    "no manifest and provenance unproven", {"provenance_max_abs_diff": diff},
                    initializers=inits)


def _links(results: list[CheckResult]) -> dict[str, str | None]:
    explained, _ = explain(results)
    return {r.id: r.consequence_of for r in explained}


NOT_LOADED = _failing("weights_load", "wrapper_prefix",
                      "checkpoint keys carry the 'module.' prefix", {"missing_keys": 17.0})
BN_TRAINING = _failing("batchnorm_export", "training_mode_export",
                       "BatchNormalization exported in training mode",
                       {"batch_dependence_max_abs": 6.7})
LOGITS = _failing("logits_agreement", "artifact_outputs_differ",
                  "artifact logits differ from the training model's by up to 0.73",
                  {"max_abs_diff": 0.7301})
DROPOUT = _failing("dropout_off", "torch_nondeterministic",
                   "torch eval forward is not deterministic", {"torch_repeat_max_abs_diff": 3.08})
ONNX_TIER = _failing("precision_per_layer", None, "onnx/output_rel_l2 0.17",
                     {"onnx/output_rel_l2": 0.17})
LAYER_OVER = _failing("precision_per_layer", "first_divergent_layer",
                      "float16: first divergent layer 'trunk.fc2'",
                      {"fp16/layers_over_budget": 3.0, "onnx/output_rel_l2": 0.2})


def test_not_loaded_explains_provenance_only_when_the_artifact_carries_the_checkpoint() -> None:
    carried = _provenance(6.7, _inits(not_in_model=["trunk.fc1.weight"]))
    assert _links([NOT_LOADED, carried])["export_integrity"] == "weights_load"
    foreign = _provenance(6.7, _inits(matched=0, unmatched=["trunk.fc1.weight"]))
    assert _links([NOT_LOADED, foreign])["export_integrity"] is None


def test_batchnorm_explains_provenance_only_when_bn_statistics_differ() -> None:
    stats = _provenance(2.9, _inits(matched=10, unmatched=["trunk.bn1.running_mean",
                                                           "trunk.bn1.running_var"]))
    links = _links([BN_TRAINING, stats, ONNX_TIER])
    assert links["export_integrity"] == links["precision_per_layer"] == "batchnorm_export"
    weights = _provenance(2.9, _inits(matched=10, unmatched=["trunk.fc1.weight",
                                                             "trunk.bn1.running_var"]))
    links = _links([BN_TRAINING, weights, LAYER_OVER])
    assert links["export_integrity"] is None and links["precision_per_layer"] is None


def test_logits_explains_provenance_when_it_is_the_same_gap() -> None:
    links = _links([LOGITS, _provenance(0.7301, _inits()), ONNX_TIER])
    assert links["export_integrity"] == links["precision_per_layer"] == "logits_agreement"
    other = _links([LOGITS, _provenance(3.5, _inits()), LAYER_OVER])
    assert other["export_integrity"] is None and other["precision_per_layer"] is None


def test_dropout_explains_precision_only_without_a_layer_over_budget() -> None:
    noisy = _failing("precision_per_layer", None, "fp16/output_rel_l2 0.19",
                     {"fp16/output_rel_l2": 0.19, "bf16/output_rel_l2": 0.17})
    assert _links([DROPOUT, noisy])["precision_per_layer"] == "dropout_off"
    assert _links([DROPOUT, LAYER_OVER])["precision_per_layer"] is None


def _unblessed(cid: str, value: float) -> CheckResult:
    return CheckResult(cid, "fail", "no golden baseline.", {"m": value}, None, {},
                       key_metric="m", reasons=[Reason("no_golden", NO_GOLDEN)])


def test_a_missing_baseline_neither_explains_nor_is_explained() -> None:
    tokenizer = _unblessed("tokenizer_parity", 0.0)
    sampling = _failing("sampling_config", "field_differs", "temperature differs: 1.0 vs 0.7",
                        {"fields_differing": 1.0})
    delta = _unblessed("logprob_delta", 1e-7)
    explained, root = explain([tokenizer, sampling, delta])
    links = {r.id: r.consequence_of for r in explained}
    assert links == {"tokenizer_parity": None, "sampling_config": None, "logprob_delta": None}
    assert root is not None and root.check == "sampling_config"  # the one real finding
    assert "see " not in next(r for r in explained if r.id == "logprob_delta").message


def test_only_missing_baselines_name_that_as_the_root() -> None:
    explained, root = explain([_unblessed("weights_load", 0.0), _unblessed("sampling_config", 0.0)])
    assert root is not None and root.kind == "no_golden" and root.explains == ()
    assert all(r.consequence_of is None for r in explained)


def test_a_check_failing_only_against_its_baseline_is_not_the_root_before_a_finding() -> None:
    """An fp32 torch-vs-ONNX gap that grew past its baseline, but not past its limit, on a model
    whose fp16 layer overflows: the overflow (a finding on this run alone) is the root cause."""
    logits = CheckResult(
        "logits_agreement", "fail", "max_abs_diff regressed vs golden: 0.0059 > 1.5e-07",
        {"max_abs_diff": 0.0059}, None, {"max_abs_diff": 0.06}, key_metric="max_abs_diff",
        reasons=[Reason("regression", "max_abs_diff regressed vs golden: 0.0059 > 1.5e-07 "
                        "(+0.003 margin)", "max_abs_diff")],
        failed_metrics=["max_abs_diff"])  # fmt: skip
    overflow = _failing("precision_per_layer", "first_divergent_layer",
                        "float16: first divergent layer 'trunk.2'",
                        {"fp16/layers_over_budget": 2.0})
    _, root = explain([logits, overflow])
    assert root is not None and root.check == "precision_per_layer"
    # alone, a regression is still the root cause of its run
    _, root = explain([logits])
    assert root is not None and root.check == "logits_agreement"


def test_the_root_cause_carries_its_finding_kind_with_or_without_an_edge() -> None:
    """A root no edge names (``independent``) still tells code its cause as a record."""
    _, alone = explain([_failing("recurrent_parity", "step_outputs_differ",
                                 "the artifact's single step differs ...",
                                 {"max_abs_diff": 0.3})])
    assert alone is not None and (alone.kind, alone.finding) == ("independent",
                                                                 "step_outputs_differ")
    _, edged = explain([_failing("logits_agreement", "squash_missing", "the tanh ...",
                                 {"max_abs_diff": 1.0}),
                        _failing("head_removal", "step_removed", "a step ...",
                                 {"policy_max_abs_diff": 1.0})])
    assert edged is not None
    assert (edged.kind, edged.finding) == ("action_transform", "squash_missing")
    _, breach = explain([_failing("logits_agreement", None, "max_abs_diff above",
                                  {"max_abs_diff": 1.0})])
    assert breach is not None and breach.finding is None
    assert alone.to_json()["finding"] == "step_outputs_differ"


def test_every_finding_kind_an_edge_names_is_declared_by_its_check() -> None:
    """An edge keyed on a kind its check never records can never match: a typo or a kind
    renamed on one branch and not the other leaves the root-cause graph silently dead there."""
    from paritygate.checks import CHECK_IDS, get_check
    from paritygate.rootcause import GRAPH

    undeclared = []
    for edge in GRAPH:
        assert edge.check in CHECK_IDS, edge.check
        declared = set(get_check(edge.check).kinds)
        undeclared += [(edge.check, edge.kind, k) for k in edge.finding_kinds or ()
                       if k not in declared]
        assert set(edge.explains) <= set(CHECK_IDS), (edge.check, edge.kind, edge.explains)
    assert not undeclared, undeclared


def test_no_edge_is_listed_twice() -> None:
    from paritygate.rootcause import GRAPH

    seen: dict[tuple[str, str | None], str] = {}
    duplicates = []
    for edge in GRAPH:
        for kind in edge.finding_kinds or (None,):
            if (edge.check, kind) in seen:
                duplicates.append((edge.check, kind, seen[(edge.check, kind)], edge.kind))
            seen[(edge.check, kind)] = edge.kind
    assert not duplicates, duplicates


def test_a_nonfinite_checkpoint_explains_the_kl_reference_check() -> None:
    """reference_parity scores the policy under test beside the reference: a NaN weight in the
    checkpoint makes its policy logits NaN (nonfinite_reference), a consequence, not a second
    root that blames the reference's provenance."""
    nan_weight = _failing("weights_load", "nonfinite_checkpoint",
                          "checkpoint tensor 'lm_head.weight' holds NaN",
                          {"nonfinite_tensors": 1.0})
    reference = _failing("reference_parity", "nonfinite_reference",
                         "non-finite logits from the policy", {"kl_exact_max": 1.0})
    explained, root = explain([nan_weight, reference])
    assert root is not None and (root.check, root.kind) == ("weights_load", "nonfinite_checkpoint")
    assert {r.id: r.consequence_of for r in explained}["reference_parity"] == "weights_load"
