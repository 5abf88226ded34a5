"""How the causal-LM's served copy differs from the checkpoint under test, named for
``weights_load``: tensors missing, extra, reshaped or non-finite, an adapter merged otherwise
(:mod:`paritygate.checks._weights_adapter`), stale weights, and a precision change the serving
dtype does not declare."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paritygate.checks._weights_adapter import (
    adapter_difference,
    named_adapter_fault,
    on_other_base,
)
from paritygate.records import Record

if TYPE_CHECKING:
    from paritygate.families.causal_lm.served_weights import WeightsSetup
    from paritygate.result import Measurement


@dataclass(frozen=True)
class Adapter(Record):
    """The training side's PEFT adapter and the base it is merged onto."""

    directory: str
    base: str
    r: int | None
    lora_alpha: float | None
    targets: int


@dataclass(frozen=True)
class AdapterRecord(Record):
    adapter: Adapter


@dataclass(frozen=True)
class MergedInServedDtype(Record):
    """The adapter's target tensors that differ only by merging in the served precision."""

    adapter_merged_in_served_dtype: list[str]


def compare_served_copy(m: Measurement, weights: WeightsSetup, state: Mapping[str, Any]) -> Any:
    """Compare the served side's tensors with the checkpoint's (``state``); name every cause."""
    from paritygate.metrics.tiers import canonical_dtype, tier_for

    served_dir = weights.serving.model_dir
    if weights.serves_training_files():
        m.note(f"served model: the training directory {served_dir} (no serving model_dir set)")
    else:
        m.note(f"served model: {served_dir} (from {weights.serving.key})")
    diff = weights.diff(dict(state))
    where = f"served copy {served_dir}"
    if weights.serving.adapter is not None:
        where = f"served base {served_dir} + adapter {weights.serving.adapter.directory}"
        m.note(f"served: the base {served_dir} with the {weights.serving.adapter.describe()} "
               "(causal_lm.serving.adapter; vLLM serves it as a LoRA, compared here merged in "
               "memory)")
    fit = served = None
    if (adapter := weights.training.adapter) is not None:
        m.note(f"training side: the base {weights.training.model_dir} with the "
               f"{adapter.describe()} merged in memory (peft merge_and_unload)")
        m.record(AdapterRecord(Adapter(str(adapter.directory), str(weights.training.model_dir),
                                       adapter.r, adapter.alpha,
                                       len(adapter.target_weights()))))
        if diff.value_diffs and not (diff.missing or diff.extra or diff.shape):
            served = weights.adapter_served(state, sorted(diff.value_diffs))
            fit = served.fit if served is not None else None
    if diff.missing:
        m.fail(
            "served_tensors_missing",
            f"{where} lacks {len(diff.missing)} checkpoint tensors: {diff.missing[:5]}",
            metric="serving_tensors_missing",
        )
    if diff.extra:
        m.fail(
            "served_tensors_extra",
            f"{where} holds {len(diff.extra)} tensors the checkpoint does not have: "
            f"{diff.extra[:5]}",
            metric="serving_tensors_extra",
        )
    equal = {k: v for k, v in diff.untied.items() if k not in diff.value_diffs}
    if equal:
        pairs = ", ".join(f"{k} = {v}" for k, v in list(equal.items())[:5])
        m.note(
            f"{where} stores {len(equal)} tied tensors separately, each equal to the checkpoint "
            f"tensor it is tied to ({pairs}): the same model"
        )
    for key, (t_shape, s_shape) in list(diff.shape.items())[:5]:
        m.fail(
            "served_shape_mismatch",
            f"{where}: shape of {key!r} differs: checkpoint {t_shape} vs served {s_shape}")
    for key in diff.nonfinite[:5]:
        m.fail("served_nonfinite", f"{where}: tensor {key!r} has NaN/Inf values")
    if fit is not None and fit.kind == "merged_in_served_dtype":
        m.note(f"{where} differs from the merged policy on {len(diff.value_diffs)} of the "
               f"adapter's target tensors only within the rounding of merging in "
               f"{', '.join(sorted(diff.served_dtypes()))} (the base and the sum each rounded "
               "once): the adapter merged in the served precision, judged by its tier")
        m.record(MergedInServedDtype(sorted(diff.value_diffs)))
    elif fit is not None and weights.training.adapter is not None:
        named_adapter_fault(m, fit, diff, where, weights.training.adapter)
    elif diff.low_rank and weights.training.adapter is None:
        adapter_difference(m, diff, where)
    elif diff.value_diffs and not on_other_base(m, weights.training, served, diff, where):
        worst = sorted(diff.value_diffs.items(), key=lambda kv: -kv[1])
        named = ", ".join(
            f"{k}{f' (untied from {diff.untied[k]})' if k in diff.untied else ''} "
            f"(max diff {v:.3g})"
            for k, v in worst[:5]
        )
        cast = " after casting to the served dtype" if diff.dtype_changes else ""
        m.fail(
            "stale_served_weights",
            f"serving weights differ from the checkpoint under test{cast} (stale or different "
            f"checkpoint): {len(worst)} of {diff.compared} tensors: {named}"
        )
    if diff.dtype_changes:
        train_dtype = canonical_dtype(weights.training.dtype)
        stored = sorted(diff.served_dtypes())
        try:
            implied = tier_for(train_dtype, canonical_dtype(stored[0]))[0]
        except ValueError:
            implied = f"{train_dtype}/{stored[0]}"
        engine_dtype = canonical_dtype(weights.serving.dtype)
        declared = {canonical_dtype(d) for d in stored} == {engine_dtype}
        text = (
            f"precision change: the served copy stores {len(diff.dtype_changes)} tensors in "
            f"{', '.join(stored)} (checkpoint {next(iter(diff.dtype_changes.values()))[0]}): "
            f"precision tier {implied}"
        )
        if declared:
            m.note(f"{text}, as the serving dtype {weights.serving.dtype} declares")
        else:
            m.fail(
                "precision_change",
                f"{text}, but the serving dtype is {weights.serving.dtype}: set "
                f"causal_lm.serving.dtype to {stored[0]} so the gate judges tier {implied}, or "
                "serve the full-precision weights"
            )
    return diff
