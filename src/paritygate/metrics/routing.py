"""MoE routing agreement: which experts each side picked for the same tokens.

Two uses share these functions:

- in a training loop, :func:`routing_mismatch` compares the experts the engine routed each
  token to (vLLM's ``routed_experts``, what routing replay records) with the trainer's own
  choice, cheap enough for every step (numpy, no per-token records);
- the gate's ``routing_agreement`` check compares router logits captured on both sides
  (:func:`compare_layer`): top-k sets, routing weights, expert load, and the router margin
  (the gap between the k-th and the (k+1)-th logit) that tells a flip at a near tie, which
  precision explains, from a flip the weights or the routing rule cause.

Inputs are numpy arrays or torch tensors (recognised by their ``detach`` method, so
``import paritygate`` never imports torch). Expert ids are integers; logits any float dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ROUTER_TIE_REL", "LayerRouting", "RoutingMismatch", "compare_layer",
           "merge_layers", "routing_mismatch", "tie_tolerance"]

ROUTER_TIE_REL: dict[str, float] = {
    # A flip is a near tie when the training side's k-th vs (k+1)-th router-logit gap is below
    # this share of the token's router-logit range (max - min). fp32: logits_agreement's 1e-4
    # relative bound on logits; fp16: ~20 u_fp16 (4.9e-4), the rounding of the hidden state
    # grown through the layers below; bf16: ~13 u_bf16 (3.9e-3), same reasoning.
    "fp32": 1e-4,
    "fp16": 1e-2,
    "bf16": 5e-2,
}
"""Relative router margin under which a flipped expert set is a near tie, by the lower
precision of the two sides."""


def tie_tolerance(tier_key: str) -> float:
    """The relative near-tie margin of a precision tier ``<training>/<inference>``: the lower
    precision's entry of :data:`ROUTER_TIE_REL` (fp32 for an unknown dtype)."""
    parts = tier_key.split("/")
    return max(ROUTER_TIE_REL.get(p, ROUTER_TIE_REL["fp32"]) for p in parts)


def _array(value: object, dtype: type) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, on any device, in any dtype
        value = value.detach().float().cpu().numpy() if dtype is np.float64 else \
            value.detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


def _same_set(train: np.ndarray, infer: np.ndarray) -> np.ndarray:
    """``(...,)`` bool: the two top-k id sets (last axis) are equal."""
    return np.all(np.sort(train, axis=-1) == np.sort(infer, axis=-1), axis=-1)


def _overlap(train: np.ndarray, infer: np.ndarray) -> np.ndarray:
    """``(...,)`` share of the training side's k experts the other side also picked."""
    hit = (train[..., :, None] == infer[..., None, :]).any(axis=-1)  # (..., K)
    return np.asarray(hit.mean(axis=-1))


@dataclass(frozen=True)
class RoutingMismatch:
    """How often the engine routed a token to other experts than the trainer (one batch).

    Every statistic is over masked tokens; with none, the fractions are NaN (a loop that
    logs them sees the gap, never a zero).
    """

    n_tokens: int
    """Compared tokens (masked)."""
    n_layers: int
    top_k: int
    routing_mismatch_frac: float
    """Share of (token, MoE layer) pairs whose top-k expert sets differ."""
    token_mismatch_frac: float
    """Share of tokens routed differently in at least one layer (what replaying the
    engine's routing in the trainer changes)."""
    expert_overlap: float
    """Mean share of the trainer's k experts the engine also picked (1.0: all agree)."""
    max_layer_mismatch_frac: float
    """The worst layer's ``routing_mismatch_frac``."""
    layer_mismatch_frac: tuple[float, ...]
    """Per MoE layer, in the inputs' layer order."""

    def as_dict(self, prefix: str = "routing/") -> dict[str, float]:
        """Scalars for a metrics logger, keys prefixed (per-layer values as ``layer_<i>``)."""
        out = {f"{prefix}{k}": float(v) for k, v in asdict(self).items()
               if k != "layer_mismatch_frac"}
        out.update({f"{prefix}layer_{i}_mismatch_frac": v
                    for i, v in enumerate(self.layer_mismatch_frac)})
        return out


def routing_mismatch(
    train_experts: object, infer_experts: object, mask: object = None
) -> RoutingMismatch:
    """Compare the expert ids each side routed every token to.

    ``train_experts`` and ``infer_experts``: integer ids shaped ``(..., L, K)`` (tokens in the
    leading axes, then MoE layers, then the k routed experts; vLLM's ``routed_experts`` is
    ``(seq_len, L, K)`` per sequence, a batch ``(B, T, L, K)``). The order within the k ids
    does not matter. ``mask``: bool or 0/1 over the leading token axes (default: all tokens).
    Raises ``ValueError`` when the shapes disagree (another top-k or layer count).
    """
    train = _array(train_experts, np.int64)
    infer = _array(infer_experts, np.int64)
    if train.shape != infer.shape or train.ndim < 2:
        raise ValueError(
            f"routed experts must share one shape (..., layers, top_k): trainer "
            f"{train.shape}, engine {infer.shape}")
    layers, k = train.shape[-2], train.shape[-1]
    train = train.reshape(-1, layers, k)
    infer = infer.reshape(-1, layers, k)
    keep = (np.ones(train.shape[0], dtype=bool) if mask is None
            else _array(mask, np.float64).reshape(-1) > 0)
    if keep.shape[0] != train.shape[0]:
        raise ValueError(f"mask covers {keep.shape[0]} tokens, routed experts {train.shape[0]}")
    train, infer = train[keep], infer[keep]
    n = int(train.shape[0])
    if n == 0:
        nan = float("nan")
        return RoutingMismatch(0, layers, k, nan, nan, nan, nan, (nan,) * layers)
    differs = ~_same_set(train, infer)  # (N, L)
    per_layer = differs.mean(axis=0)
    return RoutingMismatch(
        n_tokens=n, n_layers=layers, top_k=k,
        routing_mismatch_frac=float(differs.mean()),
        token_mismatch_frac=float(differs.any(axis=1).mean()),
        expert_overlap=float(_overlap(train, infer).mean()),
        max_layer_mismatch_frac=float(per_layer.max()),
        layer_mismatch_frac=tuple(float(v) for v in per_layer),
    )


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer's routing on both sides, over the same tokens."""

    layer: str
    """The router module's name in the training model (``model.layers.0.mlp.gate``)."""
    n_tokens: int
    flip_frac: float
    """Share of tokens whose top-k expert sets differ."""
    flip_near_tie_frac: float
    """Of all tokens: flipped where the training side's margin is a near tie."""
    flip_beyond_tie_frac: float
    """Of all tokens: flipped although the training side's margin was clear."""
    weight_diff_max: float
    """Largest routing-weight difference on tokens whose sets agree (same expert compared)."""
    weight_diff_mean: float
    logits_max_abs_diff: float
    """Largest router-logit difference (NaN when the serving side has no logits)."""
    margin_min_rel: float
    """Smallest training-side relative margin ((k-th - (k+1)-th) / range of the token's logits)."""
    near_tie_frac: float
    """Share of tokens whose training-side margin is a near tie."""
    load_training: tuple[float, ...]
    """Share of routed slots each expert received, training side."""
    load_serving: tuple[float, ...]
    weight_sum_training: float
    """Mean sum of a token's k routing weights (1.0 under ``norm_topk_prob``)."""
    weight_sum_serving: float
    nonfinite: int
    """Tokens whose router logits hold NaN/Inf on either side."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _load(ids: np.ndarray, experts: int) -> tuple[float, ...]:
    counts = np.bincount(ids.reshape(-1), minlength=experts)[:experts].astype(np.float64)
    total = counts.sum()
    return tuple(float(c) for c in (counts / total if total else counts))


def _relative_margin(logits: np.ndarray, k: int) -> np.ndarray:
    """``(N,)`` (k-th - (k+1)-th largest logit) / (max - min): scale-free router margin."""
    experts = logits.shape[-1]
    if k >= experts:
        return np.full(logits.shape[0], np.inf)
    top = -np.sort(-logits, axis=-1)  # (N, E) descending
    span = top[:, 0] - top[:, -1]
    gap = top[:, k - 1] - top[:, k]
    return np.asarray(gap / np.where(span > 0, span, 1.0))


def compare_layer(
    layer: str, training: Mapping[str, object], serving: Mapping[str, object], tie_rel: float,
) -> LayerRouting:
    """Compare one layer's routing: each side a mapping with ``logits`` ``(N, E)`` (``None``
    allowed on the serving side: routed ids only), ``experts`` ``(N, K)`` int and ``weights``
    ``(N, K)`` (``None`` allowed). ``tie_rel`` is :func:`tie_tolerance` of the tier."""
    t_logits = _array(training["logits"], np.float64)
    t_ids = _array(training["experts"], np.int64)
    s_ids = _array(serving["experts"], np.int64)
    s_logits = None if serving.get("logits") is None else _array(serving["logits"], np.float64)
    n, experts = t_logits.shape
    finite = np.isfinite(t_logits).all(axis=-1)
    if s_logits is not None:
        finite &= np.isfinite(s_logits).all(axis=-1)
    k = t_ids.shape[-1]
    margin = _relative_margin(np.where(np.isfinite(t_logits), t_logits, 0.0), k)
    near = margin < tie_rel
    # another top-k: every token is routed differently
    flipped = ~_same_set(t_ids, s_ids) if s_ids.shape[-1] == k else np.ones(n, dtype=bool)
    w_diff = np.zeros(0)
    t_w, s_w = training.get("weights"), serving.get("weights")
    sum_t = sum_s = float("nan")
    if t_w is not None:
        t_w = _array(t_w, np.float64)
        sum_t = float(t_w.sum(axis=-1).mean()) if n else float("nan")
    if s_w is not None:
        s_w = _array(s_w, np.float64)
        sum_s = float(s_w.sum(axis=-1).mean()) if n else float("nan")
    if t_w is not None and s_w is not None and s_ids.shape[-1] == k:
        agree = ~flipped & finite
        order_t = np.argsort(t_ids[agree], axis=-1)
        order_s = np.argsort(s_ids[agree], axis=-1)
        w_diff = np.abs(np.take_along_axis(t_w[agree], order_t, -1)
                        - np.take_along_axis(s_w[agree], order_s, -1)).reshape(-1)
    logit_diff = (float(np.nanmax(np.abs(t_logits - s_logits))) if s_logits is not None and n
                  else float("nan"))
    return LayerRouting(
        layer=layer, n_tokens=int(n),
        flip_frac=float(flipped.mean()) if n else 0.0,
        flip_near_tie_frac=float((flipped & near).mean()) if n else 0.0,
        flip_beyond_tie_frac=float((flipped & ~near).mean()) if n else 0.0,
        weight_diff_max=float(w_diff.max()) if w_diff.size else 0.0,
        weight_diff_mean=float(w_diff.mean()) if w_diff.size else 0.0,
        logits_max_abs_diff=logit_diff,
        margin_min_rel=float(margin.min()) if n else float("nan"),
        near_tie_frac=float(near.mean()) if n else 0.0,
        load_training=_load(t_ids, experts), load_serving=_load(s_ids, experts),
        weight_sum_training=sum_t, weight_sum_serving=sum_s,
        nonfinite=int((~finite).sum()),
    )


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    """Weighted mean over the finite values (NaN when none is)."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if np.isfinite(v) and w > 0]
    total = sum(w for _, w in pairs)
    return float(sum(v * w for v, w in pairs) / total) if total else float("nan")


def _extreme(values: Sequence[float], pick: str) -> float:
    finite = [v for v in values if not np.isnan(v)]
    if not finite:
        return float("nan")
    return float(max(finite) if pick == "max" else min(finite))


def merge_layers(parts: Sequence[LayerRouting]) -> LayerRouting:
    """One layer's routing over several batches of tokens, each compared by
    :func:`compare_layer`: shares weighted by their tokens, extremes over the batches, loads
    weighted by routed slots. Equal to one comparison over all tokens, up to float rounding
    (``weight_diff_mean`` is weighted by each batch's unflipped tokens: exact unless a batch
    holds non-finite router logits)."""
    if not parts:
        raise ValueError("no batch to merge")
    if len(parts) == 1:
        return parts[0]
    n = [p.n_tokens for p in parts]
    total = sum(n)
    agree = [p.n_tokens * (1.0 - p.flip_frac) for p in parts]

    def share(name: str) -> float:
        return _weighted([getattr(p, name) for p in parts], n) if total else 0.0

    def load(name: str) -> tuple[float, ...]:
        rows = np.asarray([getattr(p, name) for p in parts], dtype=np.float64)
        slots = np.asarray(n, dtype=np.float64)[:, None]
        merged = (rows * slots).sum(axis=0)
        s = merged.sum()
        return tuple(float(v) for v in (merged / s if s else merged))

    return LayerRouting(
        layer=parts[0].layer, n_tokens=total,
        flip_frac=share("flip_frac"), flip_near_tie_frac=share("flip_near_tie_frac"),
        flip_beyond_tie_frac=share("flip_beyond_tie_frac"),
        weight_diff_max=max(p.weight_diff_max for p in parts),
        weight_diff_mean=_weighted([p.weight_diff_mean for p in parts], agree)
        if sum(agree) else 0.0,
        logits_max_abs_diff=_extreme([p.logits_max_abs_diff for p in parts], "max"),
        margin_min_rel=_extreme([p.margin_min_rel for p in parts], "min"),
        near_tie_frac=share("near_tie_frac"),
        load_training=load("load_training"), load_serving=load("load_serving"),
        weight_sum_training=_weighted([p.weight_sum_training for p in parts], n),
        weight_sum_serving=_weighted([p.weight_sum_serving for p in parts], n),
        nonfinite=sum(p.nonfinite for p in parts),
    )
