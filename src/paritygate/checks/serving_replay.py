"""serving_replay: what serving returned in production is what the training path computes.

Each record of ``policy.serving_log`` (raw observation, served output or action, optionally the
served preprocessed inputs and a timestamp) is replayed through the training path (training
preprocessing, training model) a chunk at a time; per record the served value is compared with
the training path's, the worst records are kept, and coverage says how far the probes span the
served observations (per feature, the share of served values outside the raw probes' range), so
a gate whose probes never saw production's inputs says so.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.check import CheckSpec, Thresholds
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.policy.context import PolicyContext

DEFAULTS = {
    # The fp32 budget of logits_agreement: a served output from the shipped artifact on the same
    # raw observation differs from the training path by fp32 noise only (~2e-6 on the demo).
    "max_abs_diff": 2e-5,
    # preprocessing_parity's budget for two implementations of one normalisation.
    "preprocessed_max_abs_diff": 1e-5,
    # Observations drawn like the probes fall outside the range of n probes with probability
    # 2/(n+1) per feature (3% at the default 64; 10% measured on the worst of the demo's 8
    # features for 300 fresh records); a feature past 20% was not exercised by the probes.
    "coverage_max_outside": 0.2,
}
WORST = 5


@dataclass(frozen=True)
class WorstRecord(Record):
    """A logged record whose replay differs most from what was served."""

    where: str
    max_abs_diff: float
    timestamp: object


@dataclass(frozen=True)
class ReplayRecord(Record):
    """The worst records, the share of served values outside the probes' range per feature,
    and the log replayed."""

    worst_records: list[WorstRecord]
    coverage_outside_probe_range: dict[str, float]
    log: str


def _reference(ctx: PolicyContext, model_inputs: dict[str, np.ndarray], served: str
               ) -> np.ndarray:
    """The training model's output on model inputs, in the served terms, (n, ...)."""
    out: np.ndarray = ctx.reference.infer(model_inputs)[ctx.output_name]
    if served == "action":
        if ctx.spec.action_space == "discrete":
            index: np.ndarray = np.argmax(out.reshape(len(out), -1), axis=1)
            return index.astype(np.float64)[:, None]
        action: np.ndarray = np.asarray(ctx.deterministic_action(out), np.float64)
        return action
    return np.asarray(ctx.as_served(out), np.float64)


class _Tally:
    """Running per-record statistics over the streamed chunks."""

    def __init__(self, probe_low: dict[str, np.ndarray], probe_high: dict[str, np.ndarray]
                 ) -> None:
        self.records = self.over = self.nonfinite = self.pre_records = 0
        self.max_diff = self.sum_diff = self.pre_max = 0.0
        self.worst: list[tuple[float, int, str, Any]] = []
        self.low, self.high = probe_low, probe_high
        self.outside = {n: np.zeros(v.shape, np.int64) for n, v in probe_low.items()}
        self.pre_feature = {n: np.zeros(v.shape, np.float64) for n, v in probe_low.items()}
        self.model_on_served_inputs = 0.0

    def coverage(self, chunk: Any) -> None:
        for name, obs in chunk.obs.items():
            finite = np.isfinite(obs)
            self.outside[name] += ((finite & ((obs < self.low[name]) | (obs > self.high[name])))
                                   | ~finite).sum(0)


def _replay_chunk(ctx: PolicyContext, chunk: Any, served: str, tally: _Tally,
                  base_limit: float) -> None:
    """``chunk``: :class:`paritygate.families.policy.serving_log.Chunk`."""
    model_inputs = ctx.reference_inputs(chunk.obs)
    reference = _reference(ctx, model_inputs, served)
    got = chunk.served.reshape(reference.shape)
    diff = np.abs(got - reference).reshape(len(got), -1)
    finite = np.isfinite(got).reshape(len(got), -1).all(1)
    per = np.where(finite, diff.max(1) if diff.shape[1] else 0.0, np.inf)
    limits = base_limit * np.maximum(1.0, np.abs(reference).reshape(len(got), -1).max(1) / 10.0)
    tally.records += len(got)
    tally.nonfinite += int((~finite).sum())
    tally.over += int((per > limits).sum())
    tally.max_diff = max(tally.max_diff, float(per.max()))
    tally.sum_diff += float(per[np.isfinite(per)].sum())
    top = np.argpartition(-per, WORST)[:WORST] if len(per) > WORST else np.arange(len(per))
    for i in sorted(top.tolist()):
        item = (float(per[i]), -(chunk.first + int(i)), chunk.where(int(i)), chunk.timestamps[i])
        if len(tally.worst) < WORST:
            heapq.heappush(tally.worst, item)
        else:
            heapq.heappushpop(tally.worst, item)
    tally.coverage(chunk)
    if chunk.preprocessed is not None:
        rows = np.all([np.isfinite(v.reshape(len(v), -1)).all(1)
                       for v in chunk.preprocessed.values()], axis=0)
        if rows.any():
            tally.pre_records += int(rows.sum())
            for name, pre in chunk.preprocessed.items():
                d = np.abs(pre[rows].astype(np.float64) - model_inputs[name][rows])
                tally.pre_feature[name] = np.maximum(tally.pre_feature[name], d.max(0))
                tally.pre_max = max(tally.pre_max, float(d.max()))
            # the training model on the inputs serving computed: tells the model from the
            # preprocessing when the served outputs differ
            again = _reference(ctx, {n: v[rows] for n, v in chunk.preprocessed.items()}, served)
            d2 = np.abs(got[rows] - again)
            if d2.size:
                tally.model_on_served_inputs = max(tally.model_on_served_inputs,
                                                   float(np.nan_to_num(d2, nan=np.inf).max()))


def _feature_label(name: str, index: tuple[int, ...], several: bool) -> str:
    at = ",".join(str(i) for i in index)
    return f"{name}[{at}]" if several else f"feature {at}"


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("serving_replay")
    log = ctx.spec.serving_log
    if log is None:
        return m.skip("no policy.serving_log: no served records to replay")
    if ctx.spec.recurrent is not None:
        return m.skip("a recurrent policy's serving log would need its state per record; "
                      "replay covers feed-forward policies (see recurrent_parity)")
    path = log.path
    finite_raw = {n: v[np.isfinite(v.reshape(len(v), -1)).all(1)] for n, v in
                  ctx.raw_inputs.items()}
    tally = _Tally({n: v.min(0) for n, v in finite_raw.items()},
                   {n: v.max(0) for n, v in finite_raw.items()})
    base = float(thresholds["max_abs_diff"])
    for chunk in ctx.serving_log_chunks():
        _replay_chunk(ctx, chunk, log.served, tally, base)
    if not tally.records:
        m.fail("empty_log", f"the serving log {path.name} holds no record: nothing was replayed")
        return m
    what = "served actions" if log.served == "action" else "served outputs"
    worst = sorted(tally.worst, reverse=True)
    worst_records = [WorstRecord(w, d, t) for d, _, w, t in worst]
    shown = ", ".join(f"{w} ({d:.3g})" for d, _, w, _ in worst[:3])
    pre_cause = ""
    if tally.pre_records:
        limit = float(thresholds["preprocessed_max_abs_diff"])
        m.metric("preprocessed_max_abs_diff", tally.pre_max, threshold=limit)
        if tally.pre_max > limit:
            several = len(tally.pre_feature) > 1
            bad = [(_feature_label(n, idx, several), float(v[idx]))
                   for n, v in tally.pre_feature.items() for idx in zip(*np.nonzero(v > limit),
                                                                        strict=True)]
            bad.sort(key=lambda b: -b[1])
            names = ", ".join(f"{label} by {v:.3g}" for label, v in bad[:4])
            pre_cause = " (serving's preprocessing: see serving_preprocessing_differs)"
            m.fail("serving_preprocessing_differs",
                   f"served preprocessed inputs differ from the training preprocessing of the "
                   f"same raw observations: {names} (in {tally.pre_records} records): serving "
                   "normalises with other statistics or another rule (stale stats?)")
    if tally.nonfinite:
        m.fail("served_nonfinite", f"{tally.nonfinite} of {tally.records} {what} hold NaN/Inf")
    if tally.over:
        model_note = ""
        if tally.pre_records and tally.pre_max > float(thresholds["preprocessed_max_abs_diff"]):
            model_note = (f"; on the inputs serving computed the training model differs by "
                          f"{tally.model_on_served_inputs:.3g}, so the preprocessing explains it"
                          if tally.model_on_served_inputs <= base * 10 else "")
        pre_agrees = (tally.pre_records == tally.records and tally.pre_max
                      <= float(thresholds["preprocessed_max_abs_diff"]))
        if pre_agrees and tally.model_on_served_inputs > base * 10:
            m.fail("served_model_differs",
                   f"serving preprocessed every record as training does, yet the training model "
                   f"on those inputs differs from what serving returned by up to "
                   f"{tally.model_on_served_inputs:.3g}: serving runs another model than this "
                   "checkpoint (an older checkpoint or another artifact?)")
        m.fail("served_outputs_differ",
               f"{tally.over} of {tally.records} {what} differ from the training path's replay "
               f"of the same raw observations (up to {tally.max_diff:.3g}; worst: {shown})"
               f"{pre_cause}{model_note}", metric="records_over_tolerance")
    several = len(tally.outside) > 1
    share = {(_feature_label(n, idx, several)): float(v[idx]) / tally.records
             for n, v in tally.outside.items() for idx in np.ndindex(v.shape)}
    worst_share = max(share.values(), default=0.0)
    limit = float(thresholds["coverage_max_outside"])
    m.metric("coverage_worst_outside", worst_share, threshold=limit)
    if worst_share > limit:
        uncovered = sorted(((v, k) for k, v in share.items() if v > limit), reverse=True)
        m.fail("probes_miss_served_inputs",
               f"the probes do not span the served observations: "
               f"{', '.join(f'{k} {v:.0%}' for v, k in uncovered[:4])} of served values lie "
               "outside the probes' range (the other checks prove nothing there: add probes "
               "drawn from the serving log)")
    m.metric("records", tally.records, bad="none", ratchet=False)
    m.metric("records_over_tolerance", tally.over, threshold=0, key=True)
    m.metric("max_abs_diff", tally.max_diff, bad="none", ratchet=False)
    m.metric("mean_abs_diff", tally.sum_diff / tally.records, bad="none", ratchet=False)
    m.metric("served_nonfinite", tally.nonfinite, threshold=0)
    m.record(ReplayRecord(worst_records, share, str(path)))
    return m


CHECK = CheckSpec(
    id="serving_replay",
    summary="what serving returned is what the training path computes on the same inputs",
    measures={"policy": measure},
    defaults=DEFAULTS,
    kinds=("empty_log", "serving_preprocessing_differs", "served_nonfinite",
           "served_model_differs", "served_outputs_differ", "probes_miss_served_inputs"),
)

POSITION = 210
"""The check's place in the checklist (and in every report): the registry sorts by it."""
