"""The semantics PPO/GRPO assume of a trainer's log-prob function, measured (``logprob_impl``).

:func:`run_suite` runs the function on unpadded, left-padded, reordered and RL-layout
batches of the probe prompts and returns a :class:`SuiteResult`: the worst differences to
``Categorical(logits).log_prob`` and the named causes the check fails with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

LogprobFn = Callable[..., "Tensor"]
"""A trainer's model-level log-prob function: ``fn(model, ids, mask, *, mode, ...)`` (B, T-1)."""

Cause = tuple[str, str]
"""``(finding kind, text)``."""


@dataclass(frozen=True)
class SuiteResult:
    """What :func:`run_suite` measured of one log-prob function (``None``: not measured)."""

    causes: tuple[Cause, ...] = ()
    nonfinite_logits: str | None = None
    """Set when the model's own logits are NaN/Inf: nothing else was measured."""
    categorical_max_abs: float | None = None
    padding_max_abs: float | None = None
    batch_max_abs: float | None = None
    pad_targets_nonzero: int | None = None
    temperature_max_abs: float | None = None
    pads_after_eos_nonzero: int | None = None
    rl_layout_max_abs: float | None = None
    position_shift_max_abs: float | None = None

    def metrics(self) -> dict[str, float]:
        """The measured metrics by name (absent when the suite stopped before them)."""
        names = ("categorical_max_abs", "padding_max_abs", "batch_max_abs",
                 "pad_targets_nonzero", "temperature_max_abs", "pads_after_eos_nonzero",
                 "rl_layout_max_abs", "position_shift_max_abs")
        values = {n: getattr(self, n) for n in names}
        return {n: v for n, v in values.items() if v is not None}


@dataclass(frozen=True)
class Tolerances:
    """The check's bounds the suite's cause detection uses."""

    categorical: float
    padding: float


@dataclass
class _Unpadded:
    """Single-sequence results: the function's log-probs per sequence and their errors."""

    singles: list[torch.Tensor] = field(default_factory=list)
    cat_err: float = 0.0
    shift_before: float = 0.0
    shift_after: float = 0.0
    low: dict[str, float] = field(default_factory=dict)
    out_dtype: torch.dtype | None = None


LOW_PRECISIONS = ("bfloat16", "float16")
"""Lower precisions a trainer's log-softmax may run in (torch dtype names)."""


def _low_precision_reference(logits: Tensor, targets: Tensor, dtype_name: str) -> Tensor:
    """``log_softmax`` of the float32 logits computed in ``dtype_name``, read at the targets."""
    import torch

    dtype = getattr(torch, dtype_name)
    logp = torch.log_softmax(logits.to(dtype), dim=-1).float()  # (T-1, V)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (T-1,)


def _low_precision_cause(
    err: float, low: Mapping[str, float], out_dtype: torch.dtype | None
) -> str | None:
    """Name the precision the function computes in, when its error from the float32 reference
    is that precision's rounding: it returns that dtype, or it is at least 4x closer to the
    reference computed in that dtype than to the float32 one."""
    returned = str(out_dtype).removeprefix("torch.")
    name = returned if returned in low else None
    if name is None:
        best = min(low, key=lambda k: low[k])
        name = best if low[best] * 4 <= err else None
    if name is None:
        return None
    return (
        f"computes in {name}: its log-probs differ from the float32 reference by up to "
        f"{err:.3g}, {name} rounding (log_softmax computed in {name} is {low[name]:.3g} "
        "away); "
        "upcast the logits to float32 before log_softmax"
    )


def _categorical_log_prob(logits: Tensor, ids: Tensor) -> Tensor:
    """``Categorical(logits=logits).log_prob(ids)``: the reference semantics (torch leaves
    the distribution's methods unannotated)."""
    import torch

    dist = torch.distributions.Categorical(logits=logits)
    return dist.log_prob(ids)  # type: ignore[no-untyped-call]


def _single(fn: LogprobFn, model: nn.Module, seq: list[int], **kw: object) -> Tensor:
    import torch

    ids = torch.tensor([seq])
    out = fn(model, ids, torch.ones_like(ids), **{"mode": "raw", **kw})
    return out[0].detach().float()


def _unpadded_logits(model: nn.Module, seqs: list[list[int]]) -> list[Tensor]:
    """The model's float32 logits over each sequence, unpadded: sequences of one length share
    a forward (no padding is needed to batch them)."""
    import torch

    by_length: dict[int, list[int]] = {}
    for i, seq in enumerate(seqs):
        by_length.setdefault(len(seq), []).append(i)
    out: list[Tensor | None] = [None] * len(seqs)
    with torch.inference_mode():
        for rows in by_length.values():
            batch = model(input_ids=torch.tensor([seqs[i] for i in rows])).logits.float()
            for b, i in enumerate(rows):
                out[i] = batch[b]  # (T, V)
    return [lg for lg in out if lg is not None]  # every row was filled


def _rl_batch(
    seqs: list[list[int]], pad: int, eos: int
) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """TRL's layout: prompts left-padded, completions (ending in EOS) right-padded after EOS.

    Each probe is split in half: prompt, then completion + EOS. Returns ids, mask and per
    row ``(prompt_len, completion_len)``."""
    import torch

    parts = [(s[: max(1, len(s) // 2)], [*s[max(1, len(s) // 2):], eos]) for s in seqs]
    pw = max(len(p) for p, _ in parts)
    cw = max(len(c) for _, c in parts) + 2  # at least two pads after every EOS
    ids = torch.full((len(parts), pw + cw), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    lens = []
    for i, (p, c) in enumerate(parts):
        ids[i, pw - len(p) : pw] = torch.tensor(p)
        ids[i, pw : pw + len(c)] = torch.tensor(c)
        mask[i, pw - len(p) : pw + len(c)] = 1
        lens.append((len(p), len(c)))
    return ids, mask, lens


def run_suite(
    fn: LogprobFn,
    model: nn.Module,
    seqs: list[list[int]],
    pad: int,
    *,
    eos: int,
    temperature: float,
    helpers: ModuleType,
    logits_level: bool,
    tol: Tolerances,
) -> SuiteResult:
    """Run every property on ``fn``; returns metric values and named causes."""
    import torch

    logits = _unpadded_logits(model, seqs)  # per sequence (T, V)
    if not all(bool(torch.isfinite(lg).all()) for lg in logits):
        return SuiteResult(nonfinite_logits=(
            "non-finite logits from the training model: NaN/Inf weights? (see weights_load); "
            "no log-prob function can be checked against them"
        ))
    causes: list[Cause] = []
    base = _unpadded(fn, model, seqs, logits, causes)
    if base is None:
        return SuiteResult(causes=tuple(causes))
    temp_check = _categorical_causes(base, tol.categorical, causes)
    temp_err = _temperature(fn, model, seqs, logits, base.singles, temperature, tol.categorical,
                            temp_check, causes)
    pad_err, batch_err, pos_err, pad_nonzero = _padding(
        fn, model, seqs, pad, base.singles, helpers, logits_level, tol.padding)
    if pad_nonzero:
        causes.append((
            "pads_counted",
            f"pads counted: {pad_nonzero} positions whose target is a pad token "
            "have nonzero log-probs",
        ))
    if pad_err > tol.padding:
        causes.append((
            "padding_leak",
            f"left padding changes the log-probs of real tokens (max {pad_err:.3g}): "
            "the attention mask is not applied",
        ))
    after_eos, rl_err = _rl_layout(fn, model, seqs, pad, eos, causes)
    return SuiteResult(
        causes=tuple(causes),
        categorical_max_abs=base.cat_err,
        padding_max_abs=pad_err,
        batch_max_abs=batch_err,
        pad_targets_nonzero=pad_nonzero,
        temperature_max_abs=temp_err,
        pads_after_eos_nonzero=after_eos,
        rl_layout_max_abs=rl_err,
        position_shift_max_abs=pos_err,
    )


def _unpadded(
    fn: LogprobFn, model: nn.Module, seqs: list[list[int]],
    logits: list[torch.Tensor], causes: list[Cause],
) -> _Unpadded | None:
    """``fn`` on each sequence alone against Categorical and its off-by-one and low-precision
    forms; ``None`` (an ``output_shape`` cause added) when its output has the wrong shape."""
    import torch

    res = _Unpadded(low=dict.fromkeys(LOW_PRECISIONS, 0.0))
    for seq, lg in zip(seqs, logits, strict=True):
        ids1 = torch.tensor([seq])
        full = fn(model, ids1, torch.ones_like(ids1), mode="raw")
        if tuple(full.shape) != (1, len(seq) - 1):
            causes.append((
                "output_shape",
                f"returns shape {tuple(full.shape)} for a (1, {len(seq)}) input; expected "
                f"(1, {len(seq) - 1}): position t must score token t+1",
            ))
            return None
        res.out_dtype = full.dtype
        out = full[0].detach().float()
        ids = torch.tensor(seq)
        expected = _categorical_log_prob(lg[:-1], ids[1:])  # (T-1,)
        for dtype in LOW_PRECISIONS:
            low_ref = _low_precision_reference(lg[:-1], ids[1:], dtype)  # (T-1,)
            res.low[dtype] = max(res.low[dtype], float((out - low_ref).abs().max()))
        form_b = _categorical_log_prob(lg[:-1], ids[:-1])
        form_a = _categorical_log_prob(lg[1:], ids[1:])
        res.cat_err = max(res.cat_err, float((out - expected).abs().max()))
        res.shift_before = max(res.shift_before, float((out - form_b).abs().max()))
        res.shift_after = max(res.shift_after, float((out - form_a).abs().max()))
        res.singles.append(out)
    return res


def _categorical_causes(base: _Unpadded, tol: float, causes: list[Cause]) -> bool:
    """Name why ``fn`` differs from Categorical; True when it agrees (temperature is judged)."""
    import torch

    if not all(torch.isfinite(s).all() for s in base.singles):
        causes.append(
            ("nonfinite_logprobs", "log-prob function returns NaN/Inf on unpadded sequences"))
    cat_err = base.cat_err
    if cat_err > tol and base.shift_before <= tol:
        causes.append((
            "off_by_one",
            "off-by-one shift: position t scores token t instead of token t+1 "
            "(labels input_ids[:, :-1])",
        ))
    elif cat_err > tol and base.shift_after <= tol:
        causes.append((
            "off_by_one",
            "off-by-one shift: logits[:, 1:] scored against input_ids[:, 1:] (each token "
            "scored by its own position's logits instead of the previous position's)",
        ))
    elif cat_err > tol:
        low_cause = _low_precision_cause(cat_err, base.low, base.out_dtype)
        if low_cause:
            causes.append(("low_precision", low_cause))
    return cat_err <= tol  # an already wrong function is not judged on temperature


def _temperature(
    fn: LogprobFn, model: nn.Module, seqs: list[list[int]], logits: list[torch.Tensor],
    singles: list[torch.Tensor], temperature: float, tol: float, judge: bool,
    causes: list[Cause],
) -> float:
    """Processed mode: temperature must divide the logits. Returns the worst difference."""
    import torch

    temp_err = 0.0
    temp_ignored = False
    for seq, lg, raw in zip(seqs, logits, singles, strict=True):
        out = _single(fn, model, seq, mode="processed", temperature=temperature)
        ids = torch.tensor(seq)
        expected = _categorical_log_prob(lg[:-1] / temperature, ids[1:])
        if out.shape != expected.shape:
            continue
        err = float((out - expected).abs().max())
        temp_err = max(temp_err, err)
        if err > tol and float((out - raw).abs().max()) <= tol:
            temp_ignored = True
    if temp_ignored and judge:
        causes.append((
            "temperature_ignored",
            f"temperature ignored: processed mode with temperature {temperature:g} returns the "
            "temperature-1 log-probs (divide the logits by the sampling temperature)",
        ))
    elif temp_err > tol and judge:
        causes.append((
            "temperature_wrong",
            f"processed log-probs at temperature {temperature:g} differ from "
            f"log_softmax(logits / T) by up to {temp_err:.3g}",
        ))
    return temp_err


def _padding(
    fn: LogprobFn, model: nn.Module, seqs: list[list[int]], pad: int,
    singles: list[torch.Tensor], helpers: ModuleType, logits_level: bool, pad_tol: float,
) -> tuple[float, float, float, int]:
    """Left padding (amount, pad value) and batch composition against the unpadded rows:
    ``(padding error, batch error, missing-position-ids shift, nonzero pad targets)``."""
    import torch

    from paritygate.engines.generation import left_pad

    pad_err = batch_err = pos_err = 0.0
    pad_nonzero = 0
    orders = [list(range(len(seqs))), list(reversed(range(len(seqs))))]
    orders += [[i, (i + 1) % len(seqs)] for i in range(0, len(seqs), 2)]
    runs = [(order, extra, pad) for order in orders[:1] for extra in (0, 3, 8)]
    runs += [(orders[0], 3, seqs[0][-1])]  # another pad token value
    runs += [(order, 0, pad) for order in orders[1:]]
    for order, extra, pad_value in runs:
        batch = [seqs[i] for i in order]
        ids, mask = left_pad(batch, pad_value)
        if extra:
            ids = torch.cat([torch.full((len(batch), extra), pad_value), ids], dim=1)
            mask = torch.cat([torch.zeros((len(batch), extra), dtype=torch.long), mask], dim=1)
        out = fn(model, ids, mask, mode="raw").detach().float()  # (B, T-1)
        unpositioned = None
        width = ids.shape[1]
        for row, i in enumerate(order):
            p = width - len(seqs[i])
            got = out[row, p : width - 1]
            err = float((got - singles[i]).abs().max()) if got.numel() else 0.0
            if err > pad_tol / 10 and not logits_level:
                # Does the function match a forward without position ids (RoPE shifted)?
                if unpositioned is None:
                    with torch.inference_mode():
                        lg = model(input_ids=ids, attention_mask=mask).logits.float()
                    unpositioned = helpers.logprobs_from_logits(lg, ids, mask)
                alt = float((got - unpositioned[row, p : width - 1]).abs().max())
                if alt < err / 10:
                    pos_err = max(pos_err, err)
                    err = alt
            if order == orders[0]:
                pad_err = max(pad_err, err)
            else:
                batch_err = max(batch_err, err)
            pad_nonzero += int((out[row, : max(p - 1, 0)] != 0).sum())
    return pad_err, batch_err, pos_err, pad_nonzero


def _rl_layout(
    fn: LogprobFn, model: nn.Module, seqs: list[list[int]], pad: int, eos: int,
    causes: list[Cause],
) -> tuple[int, float]:
    """The RL batch layout: left-padded prompts, completions right-padded after EOS.
    Returns ``(nonzero targets after EOS, worst completion-token error)``."""
    ids, mask, lens = _rl_batch(seqs, pad, eos)
    out = fn(model, ids, mask, mode="raw").detach().float()
    after_eos = 0
    rl_err = 0.0
    pw = max(p for p, _ in lens)
    for row, (p_len, c_len) in enumerate(lens):
        end = pw + c_len  # first right pad
        after_eos += int((out[row, end - 1 :] != 0).sum())
        full = seqs[row] + [eos]
        ref = _single(fn, model, full)
        got = out[row, pw - p_len : end - 1]
        if got.shape == ref.shape:
            rl_err = max(rl_err, float((got - ref).abs().max()))
    if after_eos:
        causes.append((
            "pads_after_eos",
            f"pads after EOS scored: {after_eos} positions whose target is a right pad after "
            "the completion's EOS have nonzero log-probs (a mask built from the prompt only? "
            "use the prompt and completion attention mask)",
        ))
    return after_eos, rl_err
