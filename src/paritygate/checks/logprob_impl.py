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
from typing import Any

from paritygate.check import CheckSpec
from paritygate.result import Measurement

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
}


def _single(fn: Callable[..., Any], model: Any, seq: list[int]) -> Any:
    import torch

    ids = torch.tensor([seq])
    out = fn(model, ids, torch.ones_like(ids), mode="raw")
    return out[0].detach().float()


def _suite(fn: Callable[..., Any], model: Any, seqs: list[list[int]], pad: int) -> dict[str, Any]:
    """Run every property on ``fn``; returns metric values and named causes."""
    import torch

    from paritygate.engines.generation import left_pad

    causes: list[str] = []
    with torch.inference_mode():
        logits = [model(input_ids=torch.tensor([s])).logits[0].float() for s in seqs]  # (T, V)
    singles = []
    cat_err = shift0_err = 0.0
    for seq, lg in zip(seqs, logits, strict=True):
        out = _single(fn, model, seq)
        if tuple(out.shape) != (len(seq) - 1,):
            causes.append(
                f"returns shape {tuple(out.shape)} for a (1, {len(seq)}) input; "
                f"expected (1, {len(seq) - 1})"
            )
            return {"causes": causes}
        ids = torch.tensor(seq)
        expected = torch.distributions.Categorical(logits=lg[:-1]).log_prob(ids[1:])  # (T-1,)
        same_pos = torch.distributions.Categorical(logits=lg[:-1]).log_prob(ids[:-1])
        cat_err = max(cat_err, float((out - expected).abs().max()))
        shift0_err = max(shift0_err, float((out - same_pos).abs().max()))
        singles.append(out)
    if not all(torch.isfinite(s).all() for s in singles):
        causes.append("log-prob function returns NaN/Inf on unpadded sequences")
    if cat_err > DEFAULTS["categorical_max_abs"] and shift0_err <= DEFAULTS["categorical_max_abs"]:
        causes.append("off-by-one shift: position t scores token t instead of token t+1")

    pad_err = batch_err = 0.0
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
        width = ids.shape[1]
        for row, i in enumerate(order):
            p = width - len(seqs[i])
            got = out[row, p : width - 1]
            err = float((got - singles[i]).abs().max()) if got.numel() else 0.0
            if order == orders[0]:
                pad_err = max(pad_err, err)
            else:
                batch_err = max(batch_err, err)
            pad_nonzero += int((out[row, : max(p - 1, 0)] != 0).sum())
    if pad_nonzero:
        causes.append(
            f"pads counted: {pad_nonzero} positions whose target is a pad token "
            "have nonzero log-probs"
        )
    if pad_err > DEFAULTS["padding_max_abs"]:
        causes.append(
            f"left padding changes the log-probs of real tokens (max {pad_err:.3g}): "
            "the attention mask or position ids are not applied"
        )
    return {
        "categorical_max_abs": cat_err,
        "padding_max_abs": pad_err,
        "batch_max_abs": batch_err,
        "pad_targets_nonzero": pad_nonzero,
        "causes": causes,
    }


def measure(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
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
        subjects.append(("reference_", REFERENCE_FN, ref))
    for prefix, name, fn in subjects:
        res = _suite(fn, model, seqs, pad)
        for cause in res["causes"]:
            m.fail(f"{name}: {cause}")
        for key in DEFAULTS:
            if key in res:
                m.metric(
                    prefix + key,
                    res[key],
                    threshold=thresholds[key],
                    key=(key == "categorical_max_abs" and not prefix),
                )
        m.details[f"{prefix or 'user_'}function"] = name
    m.metric("sequences", len(seqs), bad="none", ratchet=False)
    return m


CHECK = CheckSpec(
    id="logprob_impl",
    summary="training-side log-prob function: Categorical semantics, t scores t+1, pads excluded",
    families=("causal_lm",),
    measure=measure,
    defaults=DEFAULTS,
    marks=("fast",),
)
