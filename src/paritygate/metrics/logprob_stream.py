""":func:`~paritygate.metrics.logprob.delta_stats` over batches, in memory that does not grow
with the record count (a rollout dump's audit).

Every statistic is exact, not approximated: sums and (co)moments merge batch by batch (Chan's
parallel update, so a mean or a standard deviation differs from numpy's over the whole array
only by float rounding, ~1e-15 relative); the order statistics the diagnosis and the p99 need
(the bulk level, ``delta_p99_abs``, the outlier cut, the worst tokens) all lie in the largest
1% of ``|delta|``, which a bounded top set holds exactly: ``floor(0.01 * T) + 3`` tokens for a
dump of ``T`` compared tokens (40 bytes a token: 2 MB per 5 x 10^6 tokens), sized from the
token count the dump's validation pass counted. Tokens that leave the top set are folded into
the moments of "the rest", so the statistics without outliers need no second pass.
Per-position buckets come from per-position sums; per-sequence rows and per-token rows keep the
first :data:`DETAIL_ROWS` (the report's lists, not its metrics); the per-token rows are the ones
``logprob_delta`` reports: every masked token with its raw delta (NaN where non-finite).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from paritygate.metrics.logprob import (
    _METRIC_NAMES,
    BIAS_SIGMAS,
    GAUSS_P99,
    MISALIGNED_CORR,
    OUTLIER_FACTOR,
    DeltaStats,
    WorstToken,
    _noise_tier,
)
from paritygate.metrics.logprob_correction import CATASTROPHIC_LOG_RATIO, IS_CAP
from paritygate.metrics.tiers import PRECISION_TIERS

DETAIL_ROWS = 512
"""Per-sequence and per-token rows kept for the report (the first ones, in dump order)."""


@dataclass
class Moments:
    """Count, means and centred (co)moments of ``(delta, logp_train, logp_infer)``."""

    n: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(3))
    comoment: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))

    def add(self, columns: np.ndarray) -> None:
        """Merge the rows of ``columns`` (N, 3) (Chan et al.'s pairwise update)."""
        m = columns.shape[0]
        if m == 0:
            return
        mean = columns.mean(axis=0)
        centred = columns - mean
        comoment = centred.T @ centred
        total = self.n + m
        shift = mean - self.mean
        self.comoment = self.comoment + comoment + np.outer(shift, shift) * (self.n * m / total)
        self.mean = self.mean + shift * (m / total)
        self.n = total

    def merged(self, other: Moments) -> Moments:
        """These moments and ``other``'s, as one set."""
        out = Moments(self.n, self.mean.copy(), self.comoment.copy())
        if other.n == 0:
            return out
        if self.n == 0:
            return Moments(other.n, other.mean.copy(), other.comoment.copy())
        total = self.n + other.n
        shift = other.mean - self.mean
        out.comoment = (self.comoment + other.comoment
                        + np.outer(shift, shift) * (self.n * other.n / total))
        out.mean = self.mean + shift * (other.n / total)
        out.n = total
        return out

    def std(self, i: int = 0) -> float:
        return math.sqrt(max(self.comoment[i, i], 0.0) / self.n) if self.n else 0.0


_TOP_FIELDS = ("abs", "order", "delta", "lt", "li", "seq", "pos", "token")


class DeltaAccumulator:
    """Feed ``(logp_train, logp_infer, mask)`` batches with :meth:`add`, then :meth:`result`
    gives the :class:`DeltaStats` :func:`delta_stats` gives on the concatenated rows."""

    def __init__(self, total_tokens: int, *, eps: float = 0.2, buckets: int = 4,
                 worst_k: int = 5, tier: Mapping[str, float] | None = None) -> None:
        self.eps, self.buckets, self.worst_k = float(eps), buckets, worst_k
        self.tier = dict(tier if tier is not None else PRECISION_TIERS["fp32/fp32"])
        self.capacity = math.floor(0.01 * max(total_tokens, 0)) + 3
        self.top: dict[str, np.ndarray] = {
            name: np.zeros(0, np.float64 if name in ("abs", "delta", "lt", "li") else np.int64)
            for name in _TOP_FIELDS
        }
        self.rest = Moments()  # tokens that left the top set
        self.sums: dict[str, list[float]] = {k: [] for k in ("prob", "k3", "ratio", "r", "chi2",
                                                           "tok_out", "cat")}
        self.prob_max = -math.inf
        self.seqs = 0
        self.seq_rows: list[dict[str, float]] = []
        self.seq_sums: dict[str, list[float]] = {
            k: [] for k in ("w", "w2", "geo", "seq_out", "geo_out")}
        self.seq_count = 0
        self.nonfinite = 0
        self.nonfinite_rows: list[WorstToken] = []
        self.nonfinite_ids: dict[tuple[int, int], int] = {}
        self.tokens = 0  # compared (finite) tokens so far: the flat order of the next one
        self.per_token: list[dict[str, float]] = []
        self.pos_sum = np.zeros(0)
        self.pos_count = np.zeros(0, np.int64)
        self.pos_max = np.zeros(0)

    def add(self, logp_train: np.ndarray, logp_infer: np.ndarray, mask: np.ndarray,
            token_ids: list[list[int]]) -> None:
        """One batch of ``(B, L)`` rows, the next ``B`` sequences; ``token_ids[b]`` are row
        ``b``'s generated tokens (for the worst tokens' text)."""
        train = np.asarray(logp_train, np.float64)
        infer = np.asarray(logp_infer, np.float64)
        sel = np.asarray(mask, bool)
        finite = np.isfinite(train) & np.isfinite(infer)
        valid = sel & finite
        bad = sel & ~finite
        with np.errstate(invalid="ignore", over="ignore"):
            delta_full = np.where(valid, train - infer, 0.0)  # (B, L)
            raw = train - infer
        self._details(raw, sel, bad, (train, infer), token_ids)
        seq_idx, pos_idx = np.nonzero(valid)
        delta = delta_full[seq_idx, pos_idx]
        lt, li = train[seq_idx, pos_idx], infer[seq_idx, pos_idx]
        self._per_sequence(delta_full, valid, bad.sum(axis=1))
        self._sequence_weights(delta, seq_idx, train.shape[0])
        self._positions(delta, pos_idx)
        self._headline(delta, lt, li)
        order = np.arange(self.tokens, self.tokens + delta.size, dtype=np.int64)
        tokens = np.array([token_ids[s][p] for s, p in zip(seq_idx, pos_idx, strict=True)],
                          dtype=np.int64)
        self._keep_top({"abs": np.abs(delta), "order": order, "delta": delta, "lt": lt, "li": li,
                        "seq": seq_idx + self.seqs, "pos": pos_idx, "token": tokens})
        self.tokens += int(delta.size)
        self.seqs += train.shape[0]

    def _details(self, raw: np.ndarray, sel: np.ndarray, bad: np.ndarray,
                 sides: tuple[np.ndarray, np.ndarray], token_ids: list[list[int]]) -> None:
        train, infer = sides
        if len(self.per_token) < DETAIL_ROWS:
            for s, p in zip(*np.nonzero(sel), strict=True):
                if len(self.per_token) >= DETAIL_ROWS:
                    break
                self.per_token.append({"seq": int(s) + self.seqs, "pos": int(p),
                                       "delta": float(raw[s, p])})
        self.nonfinite += int(bad.sum())
        for s, p in np.argwhere(bad)[: max(0, self.worst_k - len(self.nonfinite_rows))]:
            self.nonfinite_rows.append({
                "seq": int(s) + self.seqs, "pos": int(p), "delta": float("nan"),
                "logp_train": float(train[s, p]), "logp_infer": float(infer[s, p]),
                "outlier": False, "nonfinite": True})
            self.nonfinite_ids[(int(s) + self.seqs, int(p))] = int(token_ids[s][p])

    def _per_sequence(self, delta_full: np.ndarray, valid: np.ndarray,
                      bad_rows: np.ndarray) -> None:
        for i in range(min(delta_full.shape[0], DETAIL_ROWS - len(self.seq_rows))):
            d = delta_full[i][valid[i]]
            self.seq_rows.append({
                "seq": i + self.seqs, "n_tokens": int(d.size), "nonfinite_tokens": int(bad_rows[i]),
                "mean": float(d.mean()) if d.size else float("nan"),
                "max_abs": float(np.abs(d).max()) if d.size else float("nan")})

    def _sequence_weights(self, delta: np.ndarray, seq_idx: np.ndarray, rows: int) -> None:
        lo, hi = math.log(1.0 / IS_CAP), math.log(IS_CAP)
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.bincount(seq_idx, weights=delta, minlength=rows)
            counts = np.bincount(seq_idx, minlength=rows)
            have = counts > 0
            seq_log, geo_log = sums[have], sums[have] / counts[have]
            w = np.exp(seq_log)
            self.seq_sums["w"].append(float(w.sum()))
            self.seq_sums["w2"].append(float(np.square(w).sum()))
            self.seq_sums["geo"].append(float(np.exp(geo_log).sum()))
            self.seq_sums["seq_out"].append(float(((seq_log < lo) | (seq_log > hi)).sum()))
            self.seq_sums["geo_out"].append(float(((geo_log < lo) | (geo_log > hi)).sum()))
        self.seq_count += int(have.sum())

    def _positions(self, delta: np.ndarray, pos_idx: np.ndarray) -> None:
        if not delta.size:
            return
        width = int(pos_idx.max()) + 1
        if width > self.pos_sum.size:
            grow = width - self.pos_sum.size
            self.pos_sum = np.concatenate([self.pos_sum, np.zeros(grow)])
            self.pos_count = np.concatenate([self.pos_count, np.zeros(grow, np.int64)])
            self.pos_max = np.concatenate([self.pos_max, np.zeros(grow)])
        self.pos_sum[:width] += np.bincount(pos_idx, weights=delta, minlength=width)
        self.pos_count[:width] += np.bincount(pos_idx, minlength=width)
        np.maximum.at(self.pos_max, pos_idx, np.abs(delta))

    def _headline(self, delta: np.ndarray, lt: np.ndarray, li: np.ndarray) -> None:
        if not delta.size:
            return
        lo, hi = math.log(1.0 / IS_CAP), math.log(IS_CAP)
        with np.errstate(over="ignore", invalid="ignore"):
            ratio = np.exp(delta)
            prob_diff = np.abs(np.exp(lt) - np.exp(li))
            self.prob_max = max(self.prob_max, float(prob_diff.max()))
            add = {
                "prob": prob_diff.sum(), "k3": (np.expm1(delta) - delta).sum(),
                "ratio": ((ratio < 1.0 - self.eps) | (ratio > 1.0 + self.eps)).sum(),
                "r": ratio.sum(), "chi2": np.square(ratio - 1.0).sum(),
                "tok_out": ((delta < lo) | (delta > hi)).sum(),
                "cat": (np.abs(delta) > CATASTROPHIC_LOG_RATIO).sum(),
            }
        for name, value in add.items():
            self.sums[name].append(float(value))

    def _keep_top(self, batch: dict[str, np.ndarray]) -> None:
        """The ``capacity`` largest ``|delta|`` (ties: the earlier token) stay; the others'
        moments join :attr:`rest`."""
        both = {k: np.concatenate([self.top[k], batch[k]]) for k in _TOP_FIELDS}
        rank = np.lexsort((both["order"], -both["abs"]))
        keep, drop = rank[: self.capacity], rank[self.capacity:]
        if drop.size:
            self.rest.add(np.stack([both["delta"][drop], both["lt"][drop], both["li"][drop]], 1))
        self.top = {k: v[keep] for k, v in both.items()}

    def result(self, token_text: Callable[[int], str] | None = None) -> DeltaStats:
        """The statistics of every batch added (``token_text(id)``: a token's text)."""
        n = self.tokens
        top = self.top  # sorted: largest |delta| first, ties in token order
        labels, diagnosis, outliers = self._diagnose(n)
        worst: list[WorstToken] = list(self.nonfinite_rows)
        for i in range(min(self.worst_k, top["abs"].size)):
            worst.append({"seq": int(top["seq"][i]), "pos": int(top["pos"][i]),
                          "delta": float(top["delta"][i]), "logp_train": float(top["lt"][i]),
                          "logp_infer": float(top["li"][i]), "outlier": bool(outliers[i]),
                          "nonfinite": False})
        if token_text is not None:
            tokens = dict(self.nonfinite_ids)
            tokens.update({(int(s), int(p)): int(t) for s, p, t in zip(
                top["seq"][: self.worst_k], top["pos"][: self.worst_k],
                top["token"][: self.worst_k], strict=True)})
            for row in worst:
                row["text"] = token_text(tokens.get((row["seq"], row["pos"]), 0))
        return DeltaStats(
            **self._values(n), n_tokens=n, nonfinite_tokens=self.nonfinite, eps=self.eps,
            diagnosis=diagnosis, labels=labels, worst=worst, per_sequence=self.seq_rows,
            per_bucket=self._buckets(n), per_token=self.per_token, tier=self.tier,
            correction=self._correction(n))

    def _order_stat(self, n: int, index: int) -> float:
        """The ``index``-th smallest ``|delta|`` (it lies in the top set)."""
        return float(self.top["abs"][n - 1 - index])

    def _p99(self, n: int) -> float:
        """``np.quantile(|delta|, 0.99)`` (linear method), with numpy's own arithmetic."""
        virtual = np.float64(n - 1) * np.float64(0.99)
        prev = int(np.floor(virtual))
        nxt = min(prev + 1, n - 1)
        gamma = virtual - np.float64(prev)
        a, b = np.float64(self._order_stat(n, prev)), np.float64(self._order_stat(n, nxt))
        diff = b - a
        return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)

    def _values(self, n: int) -> dict[str, float]:
        if n == 0:
            return {name: float("nan") for name in _METRIC_NAMES[:8]}
        every = self.rest.merged(self._top_moments(np.ones(self.top["abs"].size, bool)))
        return {
            "delta_mean": float(every.mean[0]), "delta_std": every.std(0),
            "delta_max_abs": float(self.top["abs"][0]), "delta_p99_abs": self._p99(n),
            "prob_diff_mean": math.fsum(self.sums["prob"]) / n, "prob_diff_max": self.prob_max,
            "k3_kl": math.fsum(self.sums["k3"]) / n,
            "ratio_outside_frac": math.fsum(self.sums["ratio"]) / n,
        }

    def _top_moments(self, chosen: np.ndarray) -> Moments:
        out = Moments()
        out.add(np.stack([self.top["delta"][chosen], self.top["lt"][chosen],
                          self.top["li"][chosen]], 1))
        return out

    def _diagnose(self, n: int) -> tuple[list[str], str, np.ndarray]:
        """:func:`paritygate.metrics.logprob._diagnose` on the moments and the top set."""
        labels: list[str] = []
        parts: list[str] = []
        outliers = np.zeros(self.top["abs"].size, dtype=bool)
        if self.nonfinite:
            labels.append("non-finite")
            parts.append(f"non-finite: {self.nonfinite} token(s) have NaN/Inf log-probs")
        if n == 0:
            if not labels:
                labels.append("no tokens")
                parts.append("no tokens: the mask selects no finite token")
            return labels, "; ".join(parts), outliers
        max_abs = float(self.top["abs"][0])
        k = max(1, math.floor(0.01 * n))
        bulk = 0.0 if n <= k else self._order_stat(n, n - k - 1)
        cut = max(OUTLIER_FACTOR * bulk, float(self.tier["delta_max_abs"]))
        if max_abs > cut:
            outliers = self.top["abs"] > cut
            labels.append("outlier tokens")
            parts.append(f"outlier tokens: {int(outliers.sum())} token(s) with |delta| > "
                         f"{cut:.3g} (max {max_abs:.3g}, bulk level {bulk:.3g})")
        rest = self.rest.merged(self._top_moments(~outliers))
        shaped = False
        noise_std = float(self.tier["delta_p99_abs"]) / GAUSS_P99
        if rest.n >= 10 and rest.std(0) > noise_std:
            c = rest.comoment
            corr = (float(np.clip(c[1, 2] / math.sqrt(c[1, 1] * c[2, 2]), -1.0, 1.0))
                    if c[1, 1] > 0 and c[2, 2] > 0 else 1.0)
            if corr < MISALIGNED_CORR:
                shaped = True
                labels.append("misalignment")
                parts.append(
                    f"misalignment: trainer and engine log-probs correlate at r = {corr:.3f} "
                    f"(< {MISALIGNED_CORR}): the two sides score different tokens or contexts "
                    "(padding side, shifted positions, another prompt)")
        if rest.n and not shaped:
            self._bias_and_noise(rest, labels, parts, noise_std)
        if not labels:
            labels.append("consistent")
            parts.append("consistent: delta within the precision tier, no bias, no outliers")
        return labels, "; ".join(parts), outliers

    def _bias_and_noise(self, rest: Moments, labels: list[str], parts: list[str],
                        noise_std: float) -> None:
        mean, std = float(rest.mean[0]), rest.std(0)
        stderr = std / math.sqrt(rest.n)
        if abs(mean) > BIAS_SIGMAS * stderr and abs(mean) > float(self.tier["delta_mean_abs"]):
            labels.append("systematic bias")
            side = "trainer higher" if mean > 0 else "engine higher"
            parts.append(f"systematic bias: mean delta {mean:+.3g} ({side}), "
                         f"{abs(mean) / stderr if stderr > 0 else math.inf:.1f} standard "
                         "errors from 0")
        if std > noise_std:
            labels.append("noise")
            fits = _noise_tier(std)
            where = (f"the size of {fits} precision noise (is one side in lower precision?)"
                     if fits else "larger than any precision tier's noise: not precision "
                     "(different weights or model? see weights_load)")
            parts.append(f"noise: std {std:.3g} > {noise_std:.3g} allowed by the precision "
                         f"tier; zero-mean spread {where}")

    def _buckets(self, n: int) -> list[dict[str, float]]:
        """:func:`paritygate.metrics.logprob._per_bucket` from per-position sums."""
        if n == 0 or self.buckets < 1:
            return []
        cum = np.cumsum(self.pos_count)  # tokens at positions <= p
        q = np.linspace(0.0, 1.0, self.buckets + 1)
        ranks = np.around(q * (n - 1)).astype(np.int64)  # numpy's "nearest" method
        edges = np.unique(np.searchsorted(cum, ranks, side="right"))
        rows: list[dict[str, float]] = []
        present = np.nonzero(self.pos_count)[0]
        lo = int(present[0]) - 1
        for hi in edges.astype(int):
            span = slice(lo + 1, hi + 1)
            count = int(self.pos_count[span].sum())
            if count:
                rows.append({"pos_lo": int(lo + 1 + np.nonzero(self.pos_count[span])[0][0]),
                             "pos_hi": int(hi), "n_tokens": count,
                             "mean": float(self.pos_sum[span].sum() / count),
                             "max_abs": float(self.pos_max[span].max())})
            lo = int(hi)
        return rows

    def _correction(self, n: int) -> dict[str, float]:
        """:func:`paritygate.metrics.logprob_correction.rollout_correction`, from sums."""
        names = ("token_ratio_mean", "token_outside_frac", "seq_ratio_mean", "seq_outside_frac",
                 "geo_ratio_mean", "geo_outside_frac", "ess", "chi2", "ppl_ratio",
                 "catastrophic_frac")
        if n == 0:
            return dict.fromkeys(names, float("nan"))
        s, seqs = self.seq_sums, self.seq_count
        w, w2 = math.fsum(s["w"]), math.fsum(s["w2"])
        mean = self.rest.merged(self._top_moments(np.ones(self.top["abs"].size, bool))).mean[0]
        with np.errstate(over="ignore", invalid="ignore"):
            ess = float(np.float64(w) ** 2 / (seqs * np.float64(w2))) if seqs else float("nan")
        return {
            "token_ratio_mean": math.fsum(self.sums["r"]) / n,
            "token_outside_frac": math.fsum(self.sums["tok_out"]) / n,
            "seq_ratio_mean": w / seqs, "seq_outside_frac": math.fsum(s["seq_out"]) / seqs,
            "geo_ratio_mean": math.fsum(s["geo"]) / seqs,
            "geo_outside_frac": math.fsum(s["geo_out"]) / seqs, "ess": ess,
            "chi2": math.fsum(self.sums["chi2"]) / n, "ppl_ratio": float(math.exp(-float(mean))),
            "catastrophic_frac": math.fsum(self.sums["cat"]) / n,
        }
