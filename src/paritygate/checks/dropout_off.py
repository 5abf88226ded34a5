"""dropout_off: nothing random is left on the inference path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import ROLLOUT, Explanation, no_layer_over_budget
from paritygate.check import CheckSpec
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.base import TensorEngine
    from paritygate.families.policy.context import PolicyContext

DEFAULTS: dict[str, float] = {
    # Deterministic inference repeated on identical inputs is bitwise identical on CPU
    # (fixed thread count, same kernels); any difference means randomness.
    "repeat_max_abs_diff": 0.0,
}


def _repeat_spread(engine: TensorEngine, out: str, x: Mapping[str, np.ndarray], k: int) -> float:
    first = engine.infer(x)[out]
    worst = 0.0
    for _ in range(k - 1):
        again = engine.infer(x)[out]
        with np.errstate(invalid="ignore"):
            d = np.abs(again.astype(np.float64) - first)
        seen = d[~np.isnan(d)]  # NaN in both runs at the same place is compared below
        worst = max(worst, float(seen.max()) if seen.size else 0.0)
        if not np.array_equal(np.isnan(again), np.isnan(first)):
            worst = float("inf")
    return worst


def measure(ctx: PolicyContext, thresholds: Mapping[str, float]) -> Measurement:
    import torch

    m = Measurement("dropout_off")
    k = ctx.spec.dropout_repeats
    in_training = []
    for label, model in (("training model", ctx.reference_model),
                         ("inference model", ctx.heads_removed_model)):
        fresh_eval = [n or "<root>" for n, mod in model.named_modules() if mod.training]
        in_training += [f"{label}:{n}" for n in fresh_eval]
    if in_training:
        m.fail(
            "training_modules",
            f"modules still in training mode after eval(): {in_training[:5]} "
            "(train()/eval() overridden or mode forced)")
    # Reset the seed so a stochastic forward cannot be mistaken for determinism by luck.
    torch.manual_seed(ctx.config.seed)
    inference = ctx.new_heads_removed_engine(ctx.heads_removed_model)
    torch_spread = max(
        _repeat_spread(inference, ctx.output_name, ctx.feeds, k),
        _repeat_spread(ctx.reference, ctx.output_name, ctx.feeds, k),
    )
    if torch_spread > thresholds["repeat_max_abs_diff"]:
        m.fail(
            "torch_nondeterministic",
            f"torch eval forward is not deterministic: {k} repeated runs differ by up to "
            f"{torch_spread:.3g} (dropout with training=True, stochastic depth, or sampling in "
            "forward)")
    artifact_spread = _repeat_spread(ctx.candidate, ctx.output_name, ctx.feeds, k)
    if artifact_spread > thresholds["repeat_max_abs_diff"]:
        m.fail(
            "artifact_nondeterministic",
            f"artifact is not deterministic: {k} repeated runs differ by up to "
            f"{artifact_spread:.3g}")
    random_ops = ctx.artifact_graph.random_ops
    if random_ops:
        m.fail(
            "random_operators",
            f"artifact contains random operators: {random_ops[:5]} (dropout exported in "
            "training mode: call model.eval() before exporting)")
    m.metric("torch_repeat_max_abs_diff", torch_spread,
             threshold=thresholds["repeat_max_abs_diff"], key=True,
             limit_key="repeat_max_abs_diff")
    m.metric("artifact_repeat_max_abs_diff", artifact_spread,
             threshold=thresholds["repeat_max_abs_diff"], limit_key="repeat_max_abs_diff")
    m.metric("modules_in_training_mode", len(in_training), threshold=0)
    m.metric("random_ops", len(random_ops), threshold=0)
    m.record(Repeats(k))
    return m


@dataclass(frozen=True)
class Repeats(Record):
    """How many times each path ran on the same inputs."""

    repeats: int


CHECK = CheckSpec(
    id="dropout_off",
    summary="nothing random is left on the inference path",
    measures={"policy": measure},
    downstream=True,
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("training_modules", "torch_nondeterministic", "artifact_nondeterministic",
           "random_operators"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("dropout_off", "nondeterministic",
                ("training_modules", "torch_nondeterministic", "artifact_nondeterministic",
                 "random_operators"),
                ("head_removal", "batchnorm_export", "logits_agreement", "precision_per_layer",
                 "rollout_parity"),
                "randomness in the forward changes every output it feeds",
                fix="put the model in eval mode before exporting or serving (no dropout or "
                    "sampling on the inference path)",
                only_if=(("precision_per_layer", no_layer_over_budget), *ROLLOUT),
                rank=220),
)

POSITION = 40
"""The check's place in the checklist (and in every report): the registry sorts by it."""
