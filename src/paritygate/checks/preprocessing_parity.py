"""preprocessing_parity: training and serving preprocessing produce the same model inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.causes import REPLAY, ROLLOUT, Explanation
from paritygate.check import CheckSpec, cause_limit
from paritygate.records import OMIT_NONE, Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.policy.context import PolicyContext

EDGE_CASE_KINDS: tuple[str, ...] = ("missing", "extremes", "empty", "long")

DEFAULTS = {
    # The difference beyond float32 rounding (ROUNDING_ULPS of the larger value): 1e-5
    # catches a changed epsilon on a low-variance feature, stale stats or another clip,
    # which move outputs >= 1e-3.
    "max_abs_diff": 1e-5,
}

ROUNDING_ULPS = 4
"""Two float32 implementations of one normaliser ((x - mean) / sqrt(var + eps) in another
order, another library) differ by a few units in the last place of the value: at an extreme
input an unclipped output of 5,000 has an ulp of 4.9e-4. That much of a difference is
rounding, not a difference: it is taken off before the threshold."""


@dataclass(frozen=True)
class PreprocessingRecord(Record):
    """The inputs compared (probes and edge cases) and where the two implementations differ
    most: per feature, and per named input when the policy takes several."""

    worst_input: str | None = field(default=None, metadata=OMIT_NONE)
    per_input_max_abs_diff: dict[str, float] | None = field(default=None, metadata=OMIT_NONE)
    per_feature_max_abs_diff: dict[str, list[float]] | list[float] | None = field(
        default=None, metadata=OMIT_NONE)
    cases: list[str] = field(default_factory=list)


def unrepresentable_kinds(raw: np.ndarray, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Edge-case kinds the probes' dtype cannot hold: ``missing`` (NaN) for integer and
    boolean observations (uint8 images, discrete states)."""
    if np.issubdtype(raw.dtype, np.floating):
        return ()
    return tuple(k for k in kinds if k == "missing")


def _extremes(dtype: np.dtype) -> tuple[tuple[str, float | int], ...]:
    """The extreme values an observation of ``dtype`` can take: +-1e4 for floats, the
    type's own bounds for integers (a uint8 image's 0 and 255), True for booleans."""
    if np.issubdtype(dtype, np.floating):
        return (("extreme_high", 1e4), ("extreme_low", -1e4))
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return (("extreme_high", int(info.max)), ("extreme_low", int(info.min)))
    return (("extreme_high", 1),)


def edge_cases(raw: np.ndarray, kinds: tuple[str, ...] = EDGE_CASE_KINDS) -> dict[str, np.ndarray]:
    """Named probe batches: the probes plus the edge cases of ``kinds`` (``missing``:
    one NaN per feature and an all-NaN row, float observations only; ``extremes``: zeros
    and +-1e4, or an integer dtype's bounds; ``empty``: 0 rows; ``long``: ~4096 rows), each
    in the probes' dtype."""
    base = raw[np.all(np.isfinite(raw.reshape(len(raw), -1)), axis=1)]
    row = base[:1] if len(base) else np.zeros((1, *raw.shape[1:]), raw.dtype)
    d = row.reshape(-1).shape[0]
    cases = {"probes": raw}
    skipped = unrepresentable_kinds(raw, kinds)
    if "missing" in kinds and "missing" not in skipped:
        missing = np.repeat(row, d, axis=0).reshape(d, -1)
        missing[np.arange(d), np.arange(d)] = np.nan
        cases["missing_value"] = missing.reshape(d, *raw.shape[1:])
        cases["all_missing"] = np.full_like(row, np.nan)
    if "extremes" in kinds:
        cases["zeros"] = np.zeros_like(row)
        for label, value in _extremes(raw.dtype):
            cases[label] = np.full_like(row, value)
    if "empty" in kinds:
        cases["empty"] = np.zeros((0, *raw.shape[1:]), raw.dtype)
    if "long" in kinds:
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
        return np.asarray(np.max(cols, axis=0))

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


def _fmt(value: float) -> str:
    return "NaN" if np.isnan(value) else f"{value:.4g}"


@dataclass
class _Case:
    """Where one input batch's two outputs disagree, split by whether the raw input was NaN."""

    label: str
    ref: np.ndarray  # (N, F) training output
    cand: np.ndarray  # (N, F) serving output
    diff: np.ndarray  # (N, F) |ref - cand| where both are finite, else 0
    nonfinite_mismatch: np.ndarray  # (N, F) bool: non-finite on one side only, or another kind
    agreeing_nonfinite: int  # positions where both sides give the same NaN / +-Inf
    missing: np.ndarray  # (N, F) bool: the raw input was NaN there (whole row if not elementwise)


def _compare(label: str, raw: np.ndarray, ref: np.ndarray, cand: np.ndarray) -> _Case:
    flat_ref = ref.reshape(len(ref), -1)
    flat_cand = cand.reshape(len(cand), -1)
    nf_ref, nf_cand = ~np.isfinite(flat_ref), ~np.isfinite(flat_cand)
    same_kind = (np.isnan(flat_ref) & np.isnan(flat_cand)) | (
        np.isinf(flat_ref) & np.isinf(flat_cand) & (np.sign(flat_ref) == np.sign(flat_cand))
    )
    agree = nf_ref & nf_cand & same_kind
    mismatch = (nf_ref | nf_cand) & ~agree
    finite = ~nf_ref & ~nf_cand
    gap = np.abs(np.where(finite, flat_ref - flat_cand, 0.0).astype(np.float64))
    scale = np.maximum(np.abs(np.where(finite, flat_ref, 0.0)),
                       np.abs(np.where(finite, flat_cand, 0.0))).astype(np.float32)
    rounding = ROUNDING_ULPS * np.spacing(scale).astype(np.float64)
    diff = np.where(finite, np.maximum(gap - rounding, 0.0), 0.0)
    raw_nan = np.isnan(np.asarray(raw, np.float64).reshape(len(raw), -1))
    if raw_nan.shape == flat_ref.shape:
        missing = raw_nan
    else:  # the preprocessing changes the feature layout: attribute per row
        missing = np.repeat(raw_nan.any(1, keepdims=True), flat_ref.shape[1], axis=1)
    return _Case(label, flat_ref, flat_cand, diff, mismatch, int(agree.sum()), missing)


def _fill_cause(cases: list[_Case], limit: float) -> str | None:
    """``missing-value fill differs ...`` when every disagreement sits where the raw input was
    NaN (and there is at least one), naming the values each side produces there."""
    features: set[int] = set()
    example = None
    for c in cases:
        bad = c.nonfinite_mismatch | (c.diff > limit)
        if (bad & ~c.missing).any():
            return None
        rows, cols = np.nonzero(bad)
        features.update(int(j) for j in cols)
        if example is None and len(rows):
            r, j = rows[0], cols[0]
            example = (float(c.ref[r, j]), float(c.cand[r, j]), c.label)
    if example is None:
        return None
    ref_v, cand_v, label = example
    how_ref = "propagates NaN" if np.isnan(ref_v) else f"gives {_fmt(ref_v)}"
    how_cand = "propagates NaN" if np.isnan(cand_v) else f"gives {_fmt(cand_v)}"
    return (
        f"missing-value fill differs: training {how_ref}, serving {how_cand} for missing "
        f"values (e.g. on {label} input) at features {sorted(features)[:12]}"
    )


def _flipped_features(cases: list[_Case], limit: float) -> list[int]:
    """Features where every finite disagreement is the same value with the opposite sign
    (serving = -training), or ``[]`` when any disagreement is something else."""
    features: set[int] = set()
    for c in cases:
        rows, cols = np.nonzero(c.diff > limit)
        if len(rows) and not np.all(np.abs(c.ref[rows, cols] + c.cand[rows, cols]) <= limit):
            return []
        features.update(int(j) for j in cols)
    return sorted(features)


def _diagnose(
    cases: list[_Case], limit: float, raw_passthrough: bool, at_clip: bool,
    pixels_unscaled: bool = False,
) -> tuple[str, str]:
    """Name the likely cause from which inputs differ and where: ``(finding kind, text)``."""
    if pixels_unscaled:
        return ("image_scale_missing",
                "the serving side gives pixels in [0, 255] where training scales them to "
                "[0, 1]: the /255 image scaling (SB3's normalize_images) is missing")
    if raw_passthrough:
        return ("normalisation_missing",
                "the serving side returns the raw input: normalisation missing")
    fill = _fill_cause(cases, limit)
    if fill is not None:
        return "fill_differs", fill
    flipped = _flipped_features(cases, limit)
    if flipped and not any(c.nonfinite_mismatch.any() for c in cases):
        return ("sign_flipped",
                f"features {flipped[:12]} have the opposite sign on the serving side (serving "
                "= -training: a flipped axis or sign convention)")
    if at_clip:
        return "clip_differs", "another clip range (only saturated values differ)"
    return "stats_differ", "normalisation statistics differ (stale stats or another epsilon)"


def _unscaled_pixels(raw: np.ndarray, case: _Case) -> bool:
    """8-bit pixel probes (integers in [0, 255], stored as integers or floats) whose serving
    output is 255x the training output: the /255 scaling done on one side only."""
    values = np.asarray(raw, np.float64)
    if (not raw.size or not np.all(np.isfinite(values)) or values.min() < 0
            or values.max() > 255 or not np.array_equal(values, np.round(values))):
        return False
    scaled = case.ref * 255.0
    return bool(np.abs(scaled).max() > 1.0 and np.allclose(case.cand, scaled, rtol=1e-5,
                                                          atol=1e-3))


@dataclass
class _InputResult:
    """One observation input's preprocessing comparison."""

    worst_diff: float = 0.0
    worst_feature: int = -1
    nonfinite_mismatches: int = 0
    discrete_mismatches: int = 0
    per_feature: np.ndarray | None = None
    cases: tuple[str, ...] = ()


def _measure_input(
    m: Measurement, raw_probes: np.ndarray, training: Any, serving: Any, pre: Any,
    kinds: tuple[str, ...], limit: float, prefix: str,
) -> _InputResult:
    """Compare one input's two preprocessing implementations on its probes and edge cases;
    findings go to ``m``, their messages led by ``prefix`` (the input's name, when several)."""
    discrete = list(pre.discrete_features)
    cases = edge_cases(raw_probes, kinds)
    for kind in unrepresentable_kinds(raw_probes, kinds):
        m.note(f"{prefix}edge case {kind!r} left out: {raw_probes.dtype} observations "
               "cannot hold NaN")
    worst_case, worst_diff, worst_feature = "", 0.0, -1
    discrete_mismatch = 0
    per_feature: np.ndarray | None = None
    compared: list[_Case] = []
    raw_passthrough = pixels_unscaled = False
    for label, raw in cases.items():
        try:
            ref = _as_array(training(raw.copy())).astype(np.float64)
        except Exception as exc:
            m.fail(
                "training_raised",
                f"{prefix}training preprocessing raised on {label} input: "
                f"{type(exc).__name__}: {exc}")
            continue
        try:
            cand = _as_array(serving(raw.copy())).astype(np.float64)
        except Exception as exc:
            m.fail(
                "serving_raised",
                f"{prefix}serving preprocessing raised on {label} input: "
                f"{type(exc).__name__}: {exc}")
            continue
        if ref.shape != cand.shape:
            m.fail(
                "output_shape",
                f"{prefix}{label}: output shapes differ: training {list(ref.shape)} vs serving "
                f"{list(cand.shape)}")
            continue
        if ref.size == 0:
            continue
        case = _compare(label, raw, ref, cand)
        compared.append(case)
        feat = np.where(case.nonfinite_mismatch, np.inf, case.diff).max(axis=0)
        per_feature = feat if per_feature is None else np.maximum(per_feature, feat)
        if discrete:
            wrong = (case.diff[:, discrete] != 0) | case.nonfinite_mismatch[:, discrete]
            discrete_mismatch += int(wrong.sum())
        if label == "probes" and raw.size and np.array_equal(
            case.cand, np.asarray(raw, np.float64).reshape(len(raw), -1), equal_nan=True
        ):
            raw_passthrough = True
        if label == "probes" and _unscaled_pixels(raw, case):
            pixels_unscaled = True
        finite_feat = case.diff.max(axis=0)
        j = int(np.argmax(finite_feat))
        if finite_feat[j] > worst_diff:
            worst_case, worst_diff, worst_feature = label, float(finite_feat[j]), j
    mismatched = [c for c in compared if c.nonfinite_mismatch.any()]
    n_mismatch = int(sum(c.nonfinite_mismatch.sum() for c in compared))
    if worst_diff > limit or mismatched:
        at_clip = _diffs_at_clip([(c.ref, c.cand) for c in compared], limit)
        kind, cause = _diagnose(compared, limit, raw_passthrough, at_clip, pixels_unscaled)
        if worst_diff > limit:
            m.fail(
                kind,
                f"{prefix}feature {worst_feature} differs by {worst_diff:.3g} between training "
                f"and serving preprocessing (worst on {worst_case} input): {cause}"
            )
        elif kind == "fill_differs":
            m.fail(kind, prefix + cause)
        if kind != "fill_differs":
            for c in mismatched[:3]:
                sides = []
                for side, arr in (("training", c.ref), ("serving", c.cand)):
                    cols = np.nonzero((~np.isfinite(arr) & c.nonfinite_mismatch).any(0))[0]
                    if len(cols):
                        sides.append(f"{side} at features {[int(j) for j in cols[:12]]}")
                m.fail(
                    "nonfinite_mismatch",
                    f"{prefix}non-finite values at different positions on {c.label} input: "
                    f"NaN/Inf on one side only ({'; '.join(sides) or 'different kinds'})"
                )
    agreeing = sum(c.agreeing_nonfinite for c in compared)
    if agreeing:
        m.note(f"{prefix}both sides give the same NaN/Inf at {agreeing} positions (agreement)")
    if discrete_mismatch:
        m.fail(
            "discrete_mismatch",
            f"{prefix}{discrete_mismatch} discrete feature values differ (features {discrete})")
    return _InputResult(worst_diff, worst_feature, n_mismatch, discrete_mismatch, per_feature,
                        tuple(sorted(cases)))


def measure(ctx: PolicyContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("preprocessing_parity")
    pres = ctx.input_preprocessors or {}
    if not pres:
        return m.skip("no preprocessing configured (policy.preprocessing)")
    limit = thresholds["max_abs_diff"]
    several = len(ctx.spec.observation_inputs) > 1
    results: dict[str, _InputResult] = {}
    for name, (training, serving) in pres.items():
        pre = ctx.spec.input_preprocessing(name)
        assert pre is not None  # both preprocessing callables come from this section
        results[name] = _measure_input(
            m, ctx.raw_inputs[name], training, serving, pre, ctx.spec.probes.edge_case_kinds,
            cause_limit(thresholds, "max_abs_diff"), f"input {name!r}: " if several else "")
    worst_input = max(results, key=lambda n: results[n].worst_diff)
    worst = results[worst_input]
    m.metric("max_abs_diff", worst.worst_diff, threshold=limit, key=True)
    m.metric("nonfinite_mismatches", sum(r.nonfinite_mismatches for r in results.values()),
             threshold=0)
    m.metric("discrete_mismatches", sum(r.discrete_mismatches for r in results.values()),
             threshold=0)
    m.metric("worst_feature", worst.worst_feature, bad="none", ratchet=False)
    if several:
        m.record(PreprocessingRecord(worst_input, {n: r.worst_diff for n, r in results.items()},
                                     {n: [float(v) for v in r.per_feature]
                                      for n, r in results.items() if r.per_feature is not None},
                                     list(worst.cases)))
    else:
        m.record(PreprocessingRecord(per_feature_max_abs_diff=None if worst.per_feature is None
                                     else [float(v) for v in worst.per_feature],
                                     cases=list(worst.cases)))
    return m


CHECK = CheckSpec(
    id="preprocessing_parity",
    summary="training and serving preprocessing produce the same model inputs",
    measures={"policy": measure},
    defaults=DEFAULTS,
    kinds=("training_raised", "serving_raised", "output_shape", "normalisation_missing",
           "image_scale_missing",
           "fill_differs", "clip_differs", "sign_flipped", "stats_differ", "nonfinite_mismatch",
           "discrete_mismatch"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("preprocessing_parity", "preprocessing_mismatch", None,
                ("rollout_parity", "serving_replay"),
                "the serving preprocessing feeds the artifact other model inputs than the "
                "training preprocessing feeds the trainer",
                fix="serve the training preprocessing: the same statistics file, formula, "
                    "epsilon, clip range and feature order (the message names the features)",
                only_if=(*ROLLOUT, *REPLAY),
                rank=260),
)

POSITION = 50
"""The check's place in the checklist (and in every report): the registry sorts by it."""
