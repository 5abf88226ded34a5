"""batch_invariance on a policy artifact: a row's served outputs (and the model inputs serving
preprocessing computed) do not depend on its batch-mates. The causal-LM engine's sweep is
:mod:`paritygate.checks.batch_invariance`, which registers both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.check import Thresholds
    from paritygate.engines.batching import PolicySweep
    from paritygate.families.policy.context import PolicyContext


@dataclass(frozen=True)
class PolicyBatchRecord(Record):
    """What the check records besides its metrics (policy): the worst output difference per
    batch layout, the runs and the tier."""

    layouts: dict[str, float]
    alone_runs: int
    batched_runs: int
    declared_invariant: bool
    tier: dict[str, object]


def measure_policy(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    """Each finite raw probe through the serving path (serving preprocessing, the artifact)
    alone, then batched, in pairs, reversed and shuffled; per row, outputs and the model inputs
    serving computed compared with the alone run. Beyond the artifact's precision tier (or any
    difference when ``policy.batch_invariant`` is declared) a row depends on its batch-mates:
    a BatchNorm exported in training mode, a preprocessing normalising with batch statistics.
    A fixed batch axis serves no other batch: skipped with that reason."""
    from paritygate.engines.batching import ServingPath, policy_sweep

    m = Measurement("batch_invariance")
    engine = ctx.candidate
    fixed = getattr(engine, "fixed_batch", None)
    if fixed is not None:
        return m.skip(f"the artifact's batch axis is fixed to {fixed}: it serves no other "
                      "batch (export with a dynamic batch axis to serve and check batches)")
    keep = np.all([np.isfinite(v.reshape(len(v), -1)).all(1) for v in ctx.raw_inputs.values()],
                  axis=0)
    raw = {name: v[keep] for name, v in ctx.raw_inputs.items()}
    count = int(keep.sum())
    if count < 2:
        return m.skip("fewer than two finite probes: nothing to batch")
    serving = {name: fns[1] for name, fns in (ctx.input_preprocessors or {}).items()
               if fns[1] is not None}
    # the model inputs' other feeds (a recurrent policy's state), one row per finite probe
    state = {name: v for name, v in ctx.feeds.items() if name not in ctx.inputs}
    path = ServingPath(engine, serving, raw, state)
    try:
        path.run([0])
    except Exception as exc:  # a traced batch axis: the artifact runs its export batch only
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return m.skip(f"the artifact does not run a batch of one ({type(exc).__name__}: "
                      f"{first}): its batch axis is fixed at export")
    try:
        result = policy_sweep(path, count)
    except Exception as exc:  # a recurrent artifact whose state feeds do not batch
        if ctx.spec.recurrent is None:
            raise
        return m.skip(f"the recurrent artifact's state does not batch ({type(exc).__name__}: "
                      f"{str(exc)[:160]}): see recurrent_parity")
    declared = bool(ctx.spec.batch_invariant)
    if declared:
        tier, limit = "bitwise (policy.batch_invariant)", 0.0
    else:
        limits, note = ctx.artifact_limits(thresholds, ["output_max_abs_diff"])
        value = limits["output_max_abs_diff"]
        limit = float(value) if value is not None else float("inf")
        tier = note or "fp32 (thresholds.batch_invariance.output_max_abs_diff)"
    record(m, result, ctx, limit=limit, tier=tier, declared=declared,
           input_limit=float(thresholds["preprocessed_max_abs_diff"]))
    m.record(PolicyBatchRecord(result.per_layout, count, result.batched_runs, declared,
                               {"name": tier, "output_max_abs_diff": limit}))
    return m


def record(m: Measurement, result: PolicySweep, ctx: PolicyContext, *, limit: float, tier: str,
           declared: bool, input_limit: float) -> None:
    """The metrics and the finding (or noise note) of a :class:`PolicySweep`."""
    if not np.isfinite(result.inputs.value):
        m.skip(f"serving preprocessing gives non-finite model inputs ({result.inputs.layout}, "
               f"probe row {result.inputs.row}): that is preprocessing_parity's finding, not a "
               "batch effect; batches are not compared")
        return
    gap = result.outputs
    bitwise = gap.value == 0.0
    m.metric("output_max_abs_diff", gap.value, threshold=limit, key=True)
    m.metric("bitwise_identical", bitwise, bad="none", ratchet=False)
    where = (f"largest output difference {gap.value:.3g} ({gap.layout}, probe row {gap.row}) "
             "vs the same row alone" if gap.value > 0 else "outputs identical")
    if result.nonfinite:
        m.fail("nonfinite_output", f"served outputs hold NaN/Inf in a batch but not alone: "
               f"{', '.join(result.nonfinite[:4])} (a batch statistic over one row?)")
    if result.inputs.value > input_limit:
        m.metric("preprocessed_max_abs_diff", result.inputs.value, threshold=input_limit)
        m.fail("preprocessing_batch_dependent",
               f"serving preprocessing of a row depends on its batch: its model inputs move by "
               f"{result.inputs.value:.3g} ({result.inputs.layout}, probe row "
               f"{result.inputs.row}) vs the row alone: it normalises with the batch's own "
               "statistics instead of fixed ones (policy.preprocessing.serving)")
        return
    if gap.value <= limit:
        if not bitwise:
            m.note(f"batch-dependent rounding (noise, within the {tier} bound {limit:.3g}): "
                   f"{where}")
        return
    graph = getattr(ctx.candidate, "graph", None)
    bn = list(getattr(graph, "batchnorm_training", []) or [])
    if bn:
        m.fail("batch_statistics",
               f"the artifact normalises with each batch's statistics (BatchNorm in training "
               f"mode: {', '.join(bn[:3])}), so a row's output depends on its batch-mates: "
               f"{where}", metric="output_max_abs_diff")
    elif declared:
        m.fail("not_bitwise", f"not bitwise batch invariant, as policy.batch_invariant "
               f"declares: {where}", metric="output_max_abs_diff")
    else:
        m.fail("batch_dependent", f"served outputs depend on the batch beyond the {tier} bound "
               f"{limit:.3g}: {where}", metric="output_max_abs_diff")
