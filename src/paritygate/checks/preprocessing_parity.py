"""preprocessing_parity: training and serving preprocessing produce the same model inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paritygate.check import CheckSpec
from paritygate.result import Measurement

DEFAULTS = {
    # Both sides compute (x - mean) / sqrt(var + eps) in float32 on clipped outputs
    # bounded by |clip| ~ 10: a few ulp at 10 is ~4e-6. 1e-5 catches a changed epsilon
    # on a low-variance feature, stale stats or another clip, which move outputs >= 1e-3.
    "max_abs_diff": 1e-5,
}


def edge_cases(raw: np.ndarray) -> dict[str, np.ndarray]:
    """Named probe batches: typical rows plus missing values, extremes, empty and long inputs."""
    base = raw[np.all(np.isfinite(raw.reshape(len(raw), -1)), axis=1)]
    row = base[:1] if len(base) else np.zeros((1, *raw.shape[1:]), np.float32)
    d = row.reshape(-1).shape[0]
    cases = {"probes": raw}
    missing = np.repeat(row, d, axis=0).reshape(d, -1)
    missing[np.arange(d), np.arange(d)] = np.nan
    cases["missing_value"] = missing.reshape(d, *raw.shape[1:])
    cases["all_missing"] = np.full_like(row, np.nan)
    cases["zeros"] = np.zeros_like(row)
    for label, value in (("extreme_high", 1e4), ("extreme_low", -1e4)):
        cases[label] = np.full_like(row, value)
    cases["empty"] = np.zeros((0, *raw.shape[1:]), np.float32)
    reps = max(1, 4096 // max(1, len(base)))
    cases["long"] = np.tile(base if len(base) else row, (reps,) + (1,) * (raw.ndim - 1))
    return cases


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _diffs_at_clip(compared: list[tuple[np.ndarray, np.ndarray]], limit: float) -> bool:
    """True when every differing value sits on a saturation plateau: its feature's max |x| on
    either side (a clip bound)."""

    def tops(side: int) -> np.ndarray:
        cols = [np.where(np.isfinite(p[side]), np.abs(p[side]), 0.0).max(0) for p in compared]
        return np.max(cols, axis=0)

    top_ref, top_cand = tops(0), tops(1)  # (D,)
    any_diff = False
    for ref, cand in compared:
        with np.errstate(invalid="ignore"):
            rows, cols = np.nonzero(np.abs(ref - cand) > limit)
        if not len(rows):
            continue
        any_diff = True
        plateau = np.isclose(np.abs(ref[rows, cols]), top_ref[cols]) | np.isclose(
            np.abs(cand[rows, cols]), top_cand[cols]
        )
        if not plateau.all():
            return False
    return any_diff


def _diagnose(
    case_worst: Mapping[str, float], limit: float, raw_passthrough: bool, at_clip: bool
) -> str:
    """Name the likely cause from which kinds of input differ and where."""
    if raw_passthrough:
        return "the serving side returns the raw input: normalisation missing"
    bad = {label for label, diff in case_worst.items() if diff > limit}
    if bad <= {"missing_value", "all_missing"}:
        return "another fill value for missing inputs"
    if at_clip:
        return "another clip range (only saturated values differ)"
    return "normalisation statistics differ (stale stats or another epsilon)"


def measure(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("preprocessing_parity")
    if ctx.training_preprocess is None:
        return m.skip("no preprocessing configured (policy.preprocessing)")
    pre = ctx.spec.preprocessing
    discrete = list(pre.discrete_features)
    cases = edge_cases(ctx.raw_probes) if ctx.spec.probes.edge_cases else {"probes": ctx.raw_probes}
    worst_case, worst_diff, worst_feature = "", 0.0, -1
    discrete_mismatch = 0
    per_feature: np.ndarray | None = None
    case_worst: dict[str, float] = {}
    compared: list[tuple[np.ndarray, np.ndarray]] = []
    raw_passthrough = False
    for label, raw in cases.items():
        try:
            ref = _as_array(ctx.training_preprocess(raw.copy())).astype(np.float64)
        except Exception as exc:
            m.fail(f"training preprocessing raised on {label} input: {type(exc).__name__}: {exc}")
            continue
        try:
            cand = _as_array(ctx.serving_preprocess(raw.copy())).astype(np.float64)
        except Exception as exc:
            m.fail(f"serving preprocessing raised on {label} input: {type(exc).__name__}: {exc}")
            continue
        if ref.shape != cand.shape:
            m.fail(f"{label}: output shapes differ: training {list(ref.shape)} vs serving "
                   f"{list(cand.shape)}")
            continue
        if ref.size == 0:
            continue
        for side, arr in (("training", ref), ("serving", cand)):
            n_bad = int((~np.isfinite(arr)).sum())
            if n_bad:
                m.fail(f"{side} preprocessing output has {n_bad} NaN/Inf values on {label} input")
        flat_ref = ref.reshape(len(ref), -1)
        flat_cand = cand.reshape(len(cand), -1)
        with np.errstate(invalid="ignore"):
            diff = np.abs(flat_ref - flat_cand)
        diff = np.where(np.isfinite(diff), diff, np.inf)
        feat = diff.max(axis=0)
        per_feature = feat if per_feature is None else np.maximum(per_feature, feat)
        if discrete:
            discrete_mismatch += int((diff[:, discrete] != 0).sum())
        j = int(np.argmax(feat))
        case_worst[label] = float(feat[j])
        compared.append((flat_ref, flat_cand))
        if label == "probes" and raw.size and np.array_equal(
            cand.reshape(len(cand), -1), np.asarray(raw, np.float64).reshape(len(raw), -1)
        ):
            raw_passthrough = True
        if feat[j] > worst_diff:
            worst_case, worst_diff, worst_feature = label, float(feat[j]), j
    if worst_diff > thresholds["max_abs_diff"]:
        at_clip = _diffs_at_clip(compared, thresholds["max_abs_diff"])
        cause = _diagnose(case_worst, thresholds["max_abs_diff"], raw_passthrough, at_clip)
        m.fail(
            f"feature {worst_feature} differs by {worst_diff:.3g} between training and serving "
            f"preprocessing (worst on {worst_case} input): {cause}"
        )
    if discrete_mismatch:
        m.fail(f"{discrete_mismatch} discrete feature values differ (features {discrete})")
    m.metric("max_abs_diff", worst_diff, threshold=thresholds["max_abs_diff"], key=True)
    m.metric("discrete_mismatches", discrete_mismatch, threshold=0)
    m.metric("worst_feature", worst_feature, bad="none", ratchet=False)
    if per_feature is not None:
        m.details["per_feature_max_abs_diff"] = [float(v) for v in per_feature]
    m.details["cases"] = sorted(cases)
    return m


CHECK = CheckSpec(
    id="preprocessing_parity",
    summary="training and serving preprocessing produce the same model inputs",
    families=("policy",),
    measure=measure,
    defaults=DEFAULTS,
)
