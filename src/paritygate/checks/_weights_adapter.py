"""How a served copy differs from a PEFT policy, named for ``weights_load``: the adapter not
merged, merged at another scale (the scale it applies measured), another adapter, or this
adapter merged onto another base. Only the served tensors' values are read, never their paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.records import Keyed, Record

if TYPE_CHECKING:
    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.families.causal_lm.weights import AdapterFit, AdapterServed, WeightsDiff
    from paritygate.result import Measurement


@dataclass(frozen=True)
class OtherBase(Record):
    """The adapter's update found over other base weights."""

    scale: float
    stderr: float
    tensors: int
    other_tensors_differing: int
    base_model_name_or_path: str | None


@dataclass(frozen=True)
class FitRecord(Record):
    """How the served copy's update fits the declared adapter (kept under the finding's kind)."""

    modules: list[str]
    tensors: int
    scale: float
    residual: float
    served_scale: float | None
    declared_scale: float | None


@dataclass(frozen=True)
class LowRankDifference(Record):
    """The low-rank difference another adapter leaves, per module."""

    modules: list[str]
    tensors: int
    ranks: dict[str, int]


def on_other_base(m: Measurement, training: LMSide, served: AdapterServed | None,
                  diff: WeightsDiff, where: str) -> bool:
    """Tensors outside the adapter's targets differ, and the targets hold this adapter's
    update over them: ``adapter_on_other_base`` (True), not another checkpoint."""
    if served is None or served.other_base is None:
        return False
    found = served.other_base
    targets = training.adapter.target_weights() if training.adapter is not None else []
    others = sorted(k for k in diff.value_diffs if k not in targets)
    said = (f"; its adapter_config.json names base_model_name_or_path {served.named_base!r}, "
            f"not {training.model_dir}") if served.named_base else ""
    worst = max(others, key=lambda k: diff.value_diffs[k])
    m.fail("adapter_on_other_base",
           f"{where} holds this adapter's update (c = {found.scale:.3f} ± {found.stderr:.2g} "
           f"on its {found.tensors} target tensors) over other base weights: {len(others)} "
           f"tensors outside the adapter's targets differ from the base "
           f"{training.model_dir} (max "
           f"diff {diff.value_diffs[worst]:.3g} in {worst}): the adapter was merged onto "
           f"another base, causal_lm.model_dir is not the base it was trained on, or the "
           f"merged copy was moved after merging (trained further: a later checkpoint than "
           f"the one under test){said}",
           metric="serving_tensors_differing")
    m.record(Keyed("adapter_on_other_base", OtherBase(
        found.scale, found.stderr, found.tensors, len(others), served.named_base)))
    return True


def named_adapter_fault(m: Measurement, fit: AdapterFit, diff: WeightsDiff, where: str,
                        adapter: AdapterInfo) -> None:
    """The served copy differs from the merged policy only on the adapter's target tensors:
    name how (not merged, merged at another scale, another adapter)."""
    modules = sorted({k.split(".")[-2] for k in diff.value_diffs if "." in k})
    on = f"{len(diff.value_diffs)} of the adapter's {fit.tensors} target tensors " \
         f"({', '.join(modules)})"
    served_scale = fit.scale * adapter.scale if adapter.scale is not None else None
    if fit.kind == "adapter_not_merged":
        text = (f"{where} holds the base model's weights on {on}: the adapter is not merged "
                "(the base was served without it)")
    elif fit.kind == "adapter_scale_differs":
        text = _scale_text(fit.scale, served_scale, adapter, where, on)
    else:
        text = (f"{where} differs from the merged policy only on {on}, by an update that is "
                f"not the adapter's ({fit.residual:.0%} of it left after the best scale "
                f"{fit.scale:.3g}): another adapter was merged")
    m.fail(fit.kind, text, metric="serving_tensors_differing")
    m.record(Keyed(fit.kind, FitRecord(modules, len(diff.value_diffs), fit.scale,
                                        fit.residual, served_scale, adapter.scale)))


def _scale_text(c: float, served: float | None, adapter: AdapterInfo, where: str,
                on: str) -> str:
    """The scale the served copy applies vs the declared ``lora_alpha / r``, and the edit of
    ``lora_alpha`` (or of the scale) that gives it."""
    if served is None or adapter.r is None or adapter.alpha is None:
        return (f"{where} holds the adapter's update scaled by c = {c:.4g} on {on}: the "
                "adapter_config.json declares no lora_alpha / r to compare with")
    declared = adapter.alpha / adapter.r
    alpha = served * adapter.r
    if abs(served - 1.0) < 1e-2 * max(1.0, abs(declared)) and abs(declared - 1.0) > 1e-2:
        why = "lora_alpha / r ignored: the update merged at scale 1"
    else:
        why = (f"as if lora_alpha were {alpha:.4g} for r {adapter.r} (lora_alpha edited, or "
               f"the update merged {c:.3g} times)")
    return (f"{where} applies the adapter's B @ A at scale s = {served:.4g} on {on}, not the "
            f"declared lora_alpha / r = {adapter.alpha:g} / {adapter.r} = {declared:.4g} "
            f"(c = {c:.4g} times the trained update; {why}): merge it once at lora_alpha / r")


def adapter_difference(m: Measurement, diff: WeightsDiff, where: str) -> None:
    """Every differing tensor is a projection weight that differs by a low-rank update: an
    adapter merged otherwise than in training, not another checkpoint."""
    modules = diff.adapter_modules()
    ranks = sorted(set(diff.low_rank.values()))
    rank = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]} to {ranks[-1]}"
    worst = sorted(diff.value_diffs.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{k} (rank {diff.low_rank[k]}, max diff {v:.3g})" for k, v in worst)
    m.fail(
        "adapter_difference",
        f"the served copy differs from training by a low-rank update on {len(diff.low_rank)} "
        f"modules ({', '.join(modules)}): an adapter not merged, merged with another scale, or "
        f"another adapter (difference rank {rank}; every other tensor of {where} is the "
        f"checkpoint's): {named}",
        metric="serving_tensors_differing",
    )
    m.record(Keyed("adapter_difference", LowRankDifference(
        modules, len(diff.low_rank), dict(diff.low_rank))))
