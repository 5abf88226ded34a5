"""logprob_impl: the training-side log-prob function has the semantics PPO/GRPO assume.

Runs the function named in ``causal_lm.training.logprob_fn`` (and the library's
reference :func:`paritygate.families.causal_lm.logprobs.compute_logprobs` when that is another
function) on the probe prompts and proves: it equals
``torch.distributions.Categorical(logits).log_prob`` with position ``t`` scoring
token ``t + 1``; every row equals its unpadded single-sequence result whatever the
left-padding amount, pad token value and batch composition; positions whose
target is a pad are exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from paritygate.causes import Explanation
from paritygate.check import CheckSpec
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext

REFERENCE_FN = "paritygate.families.causal_lm.logprobs:compute_logprobs"

DEFAULTS: dict[str, float] = {
    # Same forward, two log-softmax implementations: fp32 agrees to a few ulps of the
    # logit scale (|logit| ~ 10 -> ~1e-6); 1e-5 leaves 10x margin.
    "categorical_max_abs": 1e-5,
    # Padded vs unpadded runs differ only by fp32 reduction order: the fp32/fp32 tier's
    # delta_max_abs (paritygate.metrics.tiers).
    "padding_max_abs": 1e-4,
    "batch_max_abs": 1e-4,
    # A pad target must contribute exactly nothing to the sequence log-prob.
    "pad_targets_nonzero": 0.0,
    # Processed mode: same forward, log_softmax(logits / T); same bound as categorical_max_abs.
    "temperature_max_abs": 1e-5,
    # TRL's layout: a right pad after EOS must score exactly 0.
    "pads_after_eos_nonzero": 0.0,
    # Real completion tokens in the RL layout vs unpadded: fp32 reduction order, as padding.
    "rl_layout_max_abs": 1e-4,
}
NEW_METRICS = ("temperature_max_abs", "pads_after_eos_nonzero", "rl_layout_max_abs")


SHIFT_BUDGET_METRIC = "delta_max_abs"
"""Omitting ``position_ids`` makes the positions of each left-padded row start at its pad count.
That is a layout effect of the trainer's function, judged by what it does to the quantity the
gate protects: it fails only when it moves a real token's log-prob by more than the precision
tier of ``logprob_delta`` allows one token (``delta_max_abs``, :mod:`paritygate.metrics.tiers`).
Rotary attention (Llama, Qwen2) depends on relative positions only, so there the shift is
rounding (demo LM, fp32: 1.4e-5 nats, 7x below the fp32/fp32 tier's 1e-4) and is reported as a
note with its size; absolute position embeddings (GPT-2, OPT) move log-probs by far more."""

TEST_TEMPERATURE = 0.7
"""Temperature used to test processed mode when the trainer's config samples at T = 1."""


LOW_PRECISIONS = ("bfloat16", "float16")
"""Lower precisions a trainer's log-softmax may run in (torch dtype names)."""


def _low_precision_reference(logits: Any, targets: Any, dtype_name: str) -> Any:
    """``log_softmax`` of the float32 logits computed in ``dtype_name``, read at the targets."""
    import torch

    dtype = getattr(torch, dtype_name)
    logp = torch.log_softmax(logits.to(dtype), dim=-1).float()  # (T-1, V)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (T-1,)


def _low_precision_cause(err: float, low: Mapping[str, float], out_dtype: Any) -> str | None:
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


def _categorical_log_prob(logits: Any, ids: Any) -> Any:
    """``Categorical(logits=logits).log_prob(ids)``: the reference semantics (torch leaves
    the distribution's methods unannotated)."""
    import torch

    dist = torch.distributions.Categorical(logits=logits)
    return dist.log_prob(ids)  # type: ignore[no-untyped-call]


def _single(fn: Callable[..., Any], model: Any, seq: list[int], **kw: Any) -> Any:
    import torch

    ids = torch.tensor([seq])
    out = fn(model, ids, torch.ones_like(ids), **{"mode": "raw", **kw})
    return out[0].detach().float()


def _unpadded_logits(model: Any, seqs: list[list[int]]) -> list[Any]:
    """The model's float32 logits over each sequence, unpadded: sequences of one length share
    a forward (no padding is needed to batch them)."""
    import torch

    by_length: dict[int, list[int]] = {}
    for i, seq in enumerate(seqs):
        by_length.setdefault(len(seq), []).append(i)
    out: list[Any] = [None] * len(seqs)
    with torch.inference_mode():
        for rows in by_length.values():
            batch = model(input_ids=torch.tensor([seqs[i] for i in rows])).logits.float()
            for b, i in enumerate(rows):
                out[i] = batch[b]  # (T, V)
    return out


def _rl_batch(seqs: list[list[int]], pad: int, eos: int) -> tuple[Any, Any, list[tuple[int, int]]]:
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


def _suite(
    fn: Callable[..., Any],
    model: Any,
    seqs: list[list[int]],
    pad: int,
    *,
    eos: int,
    temperature: float,
    helpers: Any,
    logits_level: bool,
) -> dict[str, Any]:
    """Run every property on ``fn``; returns metric values and named causes."""
    import torch

    from paritygate.engines.generation import left_pad

    causes: list[tuple[str, str]] = []  # (finding kind, text)
    logits = _unpadded_logits(model, seqs)  # per sequence (T, V)
    if not all(bool(torch.isfinite(lg).all()) for lg in logits):
        return {"causes": causes, "nonfinite_logits": (
            "non-finite logits from the training model: NaN/Inf weights? (see weights_load); "
            "no log-prob function can be checked against them"
        )}
    singles = []
    cat_err = shift_b = shift_a = 0.0
    low = dict.fromkeys(LOW_PRECISIONS, 0.0)
    out_dtype = None
    for seq, lg in zip(seqs, logits, strict=True):
        ids1 = torch.tensor([seq])
        full = fn(model, ids1, torch.ones_like(ids1), mode="raw")
        if tuple(full.shape) != (1, len(seq) - 1):
            causes.append((
                "output_shape",
                f"returns shape {tuple(full.shape)} for a (1, {len(seq)}) input; expected "
                f"(1, {len(seq) - 1}): position t must score token t+1",
            ))
            return {"causes": causes}
        out_dtype = full.dtype
        out = full[0].detach().float()
        ids = torch.tensor(seq)
        expected = _categorical_log_prob(lg[:-1], ids[1:])  # (T-1,)
        for dtype in LOW_PRECISIONS:
            low_ref = _low_precision_reference(lg[:-1], ids[1:], dtype)  # (T-1,)
            low[dtype] = max(low[dtype], float((out - low_ref).abs().max()))
        form_b = _categorical_log_prob(lg[:-1], ids[:-1])
        form_a = _categorical_log_prob(lg[1:], ids[1:])
        cat_err = max(cat_err, float((out - expected).abs().max()))
        shift_b = max(shift_b, float((out - form_b).abs().max()))
        shift_a = max(shift_a, float((out - form_a).abs().max()))
        singles.append(out)
    tol = DEFAULTS["categorical_max_abs"]
    if not all(torch.isfinite(s).all() for s in singles):
        causes.append(
            ("nonfinite_logprobs", "log-prob function returns NaN/Inf on unpadded sequences"))
    temp_check = cat_err <= tol  # an already wrong function is not judged on temperature
    if cat_err > tol and shift_b <= tol:
        causes.append((
            "off_by_one",
            "off-by-one shift: position t scores token t instead of token t+1 "
            "(labels input_ids[:, :-1])",
        ))
    elif cat_err > tol and shift_a <= tol:
        causes.append((
            "off_by_one",
            "off-by-one shift: logits[:, 1:] scored against input_ids[:, 1:] (each token "
            "scored by its own position's logits instead of the previous position's)",
        ))
    elif cat_err > tol:
        low_cause = _low_precision_cause(cat_err, low, out_dtype)
        if low_cause:
            causes.append(("low_precision", low_cause))

    # Processed mode: temperature must divide the logits.
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
    if temp_ignored and temp_check:
        causes.append((
            "temperature_ignored",
            f"temperature ignored: processed mode with temperature {temperature:g} returns the "
            "temperature-1 log-probs (divide the logits by the sampling temperature)",
        ))
    elif temp_err > tol and temp_check:
        causes.append((
            "temperature_wrong",
            f"processed log-probs at temperature {temperature:g} differ from "
            f"log_softmax(logits / T) by up to {temp_err:.3g}",
        ))

    pad_err = batch_err = 0.0
    pos_err = 0.0
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
            if err > DEFAULTS["padding_max_abs"] / 10 and not logits_level:
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
    if pad_nonzero:
        causes.append((
            "pads_counted",
            f"pads counted: {pad_nonzero} positions whose target is a pad token "
            "have nonzero log-probs",
        ))
    if pad_err > DEFAULTS["padding_max_abs"]:
        causes.append((
            "padding_leak",
            f"left padding changes the log-probs of real tokens (max {pad_err:.3g}): "
            "the attention mask is not applied",
        ))

    # The RL batch layout: left-padded prompts, completions right-padded after EOS.
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
    return {
        "categorical_max_abs": cat_err,
        "padding_max_abs": pad_err,
        "batch_max_abs": batch_err,
        "pad_targets_nonzero": pad_nonzero,
        "temperature_max_abs": temp_err,
        "pads_after_eos_nonzero": after_eos,
        "rl_layout_max_abs": rl_err,
        "position_shift_max_abs": pos_err,
        "causes": causes,
    }


def _shift_budget(ctx: LMContext) -> tuple[str, float]:
    """The precision tier ``logprob_delta`` judges this gate by, and its per-token bound."""
    from paritygate.metrics.tiers import PRECISION_TIERS

    key = ctx.spec.precision_tier or ctx.spec.tier()
    return key, float(PRECISION_TIERS[key][SHIFT_BUDGET_METRIC])


def _judge_position_shift(
    m: Measurement, name: str, shift: float, budget: tuple[str, float]
) -> None:
    """A missing-position-ids shift fails above the tier's per-token bound, else is a note."""
    tier, limit = budget
    m.metric("position_shift_max_abs", shift, threshold=limit, ratchet=False)
    if shift > limit:
        m.fail(
            "position_ids",
            f"{name}: position ids not passed: left padding shifts the positions of real "
            f"tokens, moving their log-probs by up to {shift:.3g} > {limit:g}, the "
            f"{tier} tier's {SHIFT_BUDGET_METRIC} (pass position_ids = cumsum(attention_mask) "
            "- 1)"
        )
    elif shift > 0.0:
        m.note(
            f"{name}: position ids not passed: left padding moves real tokens' log-probs by up "
            f"to {shift:.3g}, within the {tier} tier's {SHIFT_BUDGET_METRIC} {limit:g} "
            "(rotary positions: the shift is rounding)"
        )


def measure(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    from paritygate.imports import import_callable

    m = Measurement("logprob_impl")
    model = ctx.reference_model()
    seqs = [s for s in ctx.prompts("training") if len(s) >= 2]
    if not seqs:
        return m.skip("no probe prompt has two or more tokens")
    pad = ctx.training_tokenizer.pad_token_id or 0
    user_name = ctx.spec.training.logprob_fn
    subjects = [("", user_name, ctx.logprob_fn)]
    if user_name != REFERENCE_FN:
        ref = import_callable(REFERENCE_FN, ctx.config.path, "causal_lm.training.logprob_fn")
        subjects.insert(0, ("reference_", REFERENCE_FN, ref))
    helpers = ctx.logprob_variants()
    shift_budget = _shift_budget(ctx)
    eos = ctx.training_tokenizer.eos_token_id
    eos = pad if eos is None else eos
    t_cfg = ctx.training_sampling.spec().temperature
    temperature = t_cfg if t_cfg not in (0.0, 1.0) else TEST_TEMPERATURE
    for prefix, name, fn in subjects:
        res = _suite(
            fn, model, seqs, pad, eos=eos, temperature=temperature, helpers=helpers,
            logits_level=getattr(fn, "convention", "model") == "logits",
        )
        if "nonfinite_logits" in res:  # the model, not a function: one cause, no metrics
            m.fail("nonfinite_logits", res["nonfinite_logits"])
            break
        for kind, cause in res["causes"]:
            m.fail(kind, f"{name}: {cause}")
        if not prefix and "position_shift_max_abs" in res:
            _judge_position_shift(m, name, float(res["position_shift_max_abs"]), shift_budget)
        for key in DEFAULTS:
            if key in res:
                m.metric(
                    prefix + key,
                    res[key],
                    threshold=thresholds[key],
                    key=(key == "categorical_max_abs" and not prefix),
                    ratchet=key not in NEW_METRICS,
                    limit_key=key,
                )
        m.details[f"{prefix or 'user_'}function"] = name
    m.details["convention"] = getattr(ctx.logprob_fn, "convention", "model")
    m.details["processed_temperature"] = temperature
    m.metric("sequences", len(seqs), bad="none", ratchet=False)
    return m


CHECK = CheckSpec(
    id="logprob_impl",
    summary="training-side log-prob function: Categorical semantics, t scores t+1, pads excluded",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("nonfinite_logits", "output_shape", "nonfinite_logprobs", "off_by_one",
           "temperature_ignored", "temperature_wrong", "low_precision", "pads_counted",
           "padding_leak", "pads_after_eos", "position_ids"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("logprob_impl", "logprob_recompute", None,
                ("logprob_delta",),
                "the trainer's log-prob recompute is wrong, so its deltas to the engine are too",
                rank=270),
)

POSITION = 120
"""The check's place in the checklist (and in every report): the registry sorts by it."""
