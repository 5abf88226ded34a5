"""reward_parity: the reward scores what serving shows it as it scored training samples.

Reads ``causal_lm.reward`` (skipped when absent). For a reward model (an HF sequence classifier
with one label) it scores the (prompt, completion) samples as training did and as serving does
(padding side, max length, truncation side, scored span, chat template, EOS), each batched
through the model's own forward, and proves:

- the scoring copy's tensors are the trained reward model's (bitwise; a declared ``dtype``: the
  exact cast, its scores then judged by that dtype's tier);
- every score is read at the last real token, never at a pad (transformers reads the rightmost
  token that is not ``config.pad_token_id``; a missing pad id cannot score a batch);
- each sample's serving score equals its training score, and a difference is named by the
  setting that causes it, with how many samples it affects;
- the serving scores do not depend on the padding amount, the batch order or batching at all;
- the score's slope against completion length (each completion repeated 1-3 times) is
  reported, and fails above ``length_slope_max`` (a head that averages over positions).

A reward function (``module:callable(prompts, completions)``, GRPO style) is held to the same
batch invariance and length slope; beside a reward model it must return the trained model's
scores on the same samples (unless ``function_matches_model: false``): the score difference and
the share of pair rankings it flips are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paritygate.causes import Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._reward_function import compare_with_model
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.causal_lm.reward import Encoded, RewardSetup, Sample, Scores

DEFAULTS: dict[str, float] = {
    # Bitwise: the scoring copy is the trained reward model's tensors or another model.
    "tensors_differ_from_trained": 0.0,
    # A score moved by more than score_max_abs is a sample scored differently.
    "samples_affected": 0.0,
    # One forward of one model, other padding: fp32 reduction order and rotary position
    # offsets, the fp32/fp32 tier's delta_max_abs (paritygate.metrics.tiers) on a scalar head.
    "score_max_abs": 1e-4,
    "padding_max_abs": 1e-4,
    "batch_max_abs": 1e-4,
    # A score read at a pad token is the head's output at a position that is not the text.
    "read_at_pad": 0.0,
}
TIERED = ("score_max_abs", "padding_max_abs", "batch_max_abs")
"""Judged by the declared dtype's tier (``<dtype>/fp32``'s ``delta_max_abs``) when the scoring
copy runs in a lower precision than the trained model."""

LENGTH_REPEATS = (1, 2, 3)
LAYOUT_KINDS = {
    "padding_side": "padding_side_differs",
    "max_length": "truncation_differs",
    "truncation_side": "truncation_differs",
    "scored_span": "scored_span_differs",
    "chat_template": "chat_template_differs",
    "append_eos": "eos_differs",
}


@dataclass(frozen=True)
class RewardTier(Record):
    """The precision tier of a reward model declared in low precision."""

    tier: str


@dataclass(frozen=True)
class RewardSample(Record):
    """One scored sample: both sides' scores, how far serving moved it, which side cut it and
    whether serving read its score at a pad."""

    id: str
    training: float
    serving: float
    moved: float
    cut: str
    read_at_pad: bool


@dataclass(frozen=True)
class RewardRecord(Record):
    """Each side's padding and truncation layout, and every sample's scores."""

    layout: dict[str, dict[str, object]]
    samples: list[RewardSample]


def _limits(setup: RewardSetup, thresholds: Thresholds, m: Measurement) -> dict[str, float]:
    limits = {k: thresholds[k] for k in DEFAULTS}
    if setup.dtype not in (None, "float32"):
        from paritygate.metrics.tiers import tier_for

        tier, bounds = tier_for(setup.dtype, "float32")
        m.record(RewardTier(tier))
        for name in TIERED:
            if not thresholds.is_set(name):
                limits[name] = bounds["delta_max_abs"]
    return limits


def _provenance(m: Measurement, setup: RewardSetup, limits: dict[str, float]) -> None:
    if setup.trained_dir is None or setup.model_dir is None:
        return
    if setup.trained_dir == setup.model_dir:
        m.metric("tensors_differ_from_trained", 0, threshold=limits["tensors_differ_from_trained"])
        if setup.dtype:
            m.note(f"the scoring copy is the trained directory, run in the declared {setup.dtype}")
        return
    diff = setup.compare_with_trained()
    lowered = sorted(diff.served_dtypes())
    differ = (len(diff.missing) + len(diff.extra) + len(diff.shape) + len(diff.value_diffs)
              + (len(diff.cast_exact) if not setup.dtype else 0))
    m.metric("tensors_differ_from_trained", differ,
             threshold=limits["tensors_differ_from_trained"])
    if diff.missing or diff.extra or diff.shape or diff.value_diffs:
        worst = max(diff.value_diffs.items(), key=lambda kv: kv[1], default=("-", 0.0))
        m.fail("stale_reward_model",
               f"the scoring reward model is not the trained one: {len(diff.value_diffs)} of "
               f"{diff.compared} tensors differ (max abs {worst[1]:.3g} in {worst[0]}), "
               f"{len(diff.missing)} missing, {len(diff.extra)} extra, {len(diff.shape)} "
               "reshaped: a reward model from another checkpoint",
               metric="tensors_differ_from_trained")
    elif lowered and not setup.dtype:
        m.fail("reward_precision_undeclared",
               f"the scoring reward model stores {len(diff.cast_exact)} tensors in "
               f"{', '.join(lowered)}, each exactly the trained one's cast: a precision change "
               "the config does not declare (causal_lm.reward.dtype)",
               metric="tensors_differ_from_trained")


def _where_read(m: Measurement, setup: RewardSetup, side: str, res: Scores, pad_id: int) -> int:
    """Count scores read at a pad (a finding) and before the last real token (a note)."""
    pads = sum(res.read_pad)
    early = sum(1 for at, last, p in zip(res.read_at, res.last_real, res.read_pad, strict=True)
                if 0 <= at < last and not p)
    if pads:
        cfg = setup.config_pad_token_id
        why = (f"config.pad_token_id {cfg} is not the pad the scorer pads with ({pad_id})"
               if cfg != pad_id else "the pad id appears inside the text")
        m.fail("score_read_at_pad",
               f"{side}: {pads} of {len(res.scores)} scores are read at a pad token, not the "
               f"last real token ({why})", metric="read_at_pad")
    if early:
        eos = setup.tokenizer.eos_token_id if setup.tokenizer is not None else None
        why = (" (pad_token_id == eos_token_id: the EOS ending each text counts as padding)"
               if setup.config_pad_token_id == eos else "")
        m.note(f"{side}: {early} of {len(res.scores)} scores are read before the last real "
               f"token{why}")
    if any(at < 0 for at in res.read_at):
        m.note(f"{side}: the head's per-position outputs were not observed; where the score is "
               "read is not verified")
    return pads


def _singles_max_abs(setup: RewardSetup, enc: Encoded, batched: list[float]) -> float:
    """Each sample scored alone (samples of one length share an unpadded forward)."""
    layout = setup.serving
    assert layout is not None
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(enc.seqs):
        by_len.setdefault(len(s), []).append(i)
    worst = 0.0
    for rows in by_len.values():
        res = setup.score(setup.scoring, [enc.seqs[i] for i in rows], layout.padding_side,
                          layout.batch_size)
        for i, value in zip(rows, res.scores, strict=True):
            worst = max(worst, abs(value - batched[i]))
    return worst


def _slope(lengths: list[list[int]], scores: list[list[float]]) -> float:
    """Pooled within-sample least-squares slope of score against length (score per token)."""
    num = den = 0.0
    for ns, ss in zip(lengths, scores, strict=True):
        n_mean, s_mean = sum(ns) / len(ns), sum(ss) / len(ss)
        num += sum((n - n_mean) * (s - s_mean) for n, s in zip(ns, ss, strict=True))
        den += sum((n - n_mean) ** 2 for n in ns)
    return num / den if den else 0.0


def _judge_slope(m: Measurement, name: str, slope: float, limit: float | None, who: str) -> None:
    m.metric(name, abs(slope), threshold=limit, ratchet=False,
             bad="higher" if limit is not None else "none")
    if limit is not None and abs(slope) > limit:
        m.fail("length_slope",
               f"{who}: the score moves by {slope:.3g} per completion token on length variants "
               f"(each completion repeated {', '.join(map(str, LENGTH_REPEATS))} times), above "
               f"length_slope_max {limit:g}: a head that averages over positions rewards length",
               metric=name)


def _model_part(m: Measurement, setup: RewardSetup, limits: dict[str, float],
                slope_max: float | None) -> None:
    from dataclasses import replace

    train, serve = setup.training, setup.serving
    assert train is not None and serve is not None
    pad_id = setup.pad_id
    _provenance(m, setup, limits)
    if setup.config_pad_token_id is None:
        m.fail("pad_token_missing",
               "the reward model's config.json has no pad_token_id: transformers cannot score "
               "a batch (\"Cannot handle batch sizes > 1 if no padding token is defined\") and "
               "one at a time reads the last position, a pad when padded; set "
               "model.config.pad_token_id = tokenizer.pad_token_id before saving")
        return
    enc_t, enc_s = setup.encode(train), setup.encode(serve)
    res_s = setup.score(setup.scoring, enc_s.seqs, serve.padding_side, serve.batch_size)
    same = train == serve and setup.trained is setup.scoring
    res_t = res_s if same else setup.score(setup.trained, enc_t.seqs, train.padding_side,
                                           train.batch_size)
    for side, res in (("training", res_t), ("serving", res_s)):
        if res.error is not None:
            m.fail("scoring_failed", f"{side} scoring raised {res.error}")
            return
    if not all(map(_finite, res_t.scores + res_s.scores)):
        m.fail("nonfinite_reward", "the reward model returns NaN/Inf scores")
        return
    pads = _where_read(m, setup, "serving", res_s, pad_id)
    pads_t = _where_read(m, setup, "training", res_t, pad_id) if serve != train else pads
    m.metric("read_at_pad", max(pads, pads_t), threshold=limits["read_at_pad"])

    diffs = [abs(s - t) for s, t in zip(res_s.scores, res_t.scores, strict=True)]
    affected = [i for i, d in enumerate(diffs) if d > limits["score_max_abs"]]
    m.metric("score_max_abs", max(diffs), threshold=limits["score_max_abs"], ratchet=False)
    m.metric("samples_affected", len(affected), threshold=limits["samples_affected"], key=True)
    changed = train.differences(serve)
    m.record(RewardRecord({"training": train.__dict__, "serving": serve.__dict__}, [
        RewardSample(sample.id, t, v, abs(v - t),
                     ("serving" if cs else "") + (" training" if ct else ""), p)
        for sample, t, v, cs, ct, p in zip(setup.samples, res_t.scores, res_s.scores,
                                           enc_s.cut, enc_t.cut, res_s.read_pad, strict=True)]))
    if affected:
        named = False
        for name in changed:
            kind = LAYOUT_KINDS[name]
            if kind == "truncation_differs":
                cut = [i for i in affected if enc_s.cut[i] or enc_t.cut[i]]
                if not cut:
                    continue
                text = (f"truncation differs (training max_length {train.max_length}, "
                        f"{train.truncation_side}; serving {serve.max_length}, "
                        f"{serve.truncation_side}): {len(cut)} of {len(diffs)} samples are cut "
                        "differently before they are scored")
            else:
                text = (f"{name} differs: training {getattr(train, name)!r} vs serving "
                        f"{getattr(serve, name)!r}")
            named = True
            m.fail(kind, f"{text}; {len(affected)} of {len(diffs)} scores move (up to "
                   f"{max(diffs):.3g})", metric="samples_affected")
        if not named and not m.findings:
            m.fail("scores_differ",
                   f"{len(affected)} of {len(diffs)} serving scores differ from training's "
                   f"(up to {max(diffs):.3g}) under the same settings",
                   metric="samples_affected")
    elif changed:
        m.note(f"{', '.join(changed)} differ between training and serving, but no score moves "
               f"by more than {limits['score_max_abs']:g} (max {max(diffs):.3g})")

    # -- invariance of the serving scores ---------------------------------------------------
    extra = setup.score(setup.scoring, enc_s.seqs, serve.padding_side, serve.batch_size, extra=3)
    order = list(reversed(range(len(enc_s.seqs))))
    rev = setup.score(setup.scoring, [enc_s.seqs[i] for i in order], serve.padding_side,
                      serve.batch_size)
    padding_err = max(abs(a - b) for a, b in zip(extra.scores, res_s.scores, strict=True))
    batch_err = max(abs(rev.scores[j] - res_s.scores[i]) for j, i in enumerate(order))
    batch_err = max(batch_err, _singles_max_abs(setup, enc_s, res_s.scores))
    m.metric("padding_max_abs", padding_err, threshold=limits["padding_max_abs"])
    m.metric("batch_max_abs", batch_err, threshold=limits["batch_max_abs"])
    if not pads and padding_err > limits["padding_max_abs"]:
        m.fail("padding_variance",
               f"serving scores change by up to {padding_err:.3g} with 3 more pads per row "
               f"({serve.padding_side} padding): positions are not taken from the mask",
               metric="padding_max_abs")
    if not pads and batch_err > limits["batch_max_abs"]:
        m.fail("batch_variance",
               f"serving scores depend on the batch (alone vs batched, another order): up to "
               f"{batch_err:.3g}", metric="batch_max_abs")

    # -- length slope -------------------------------------------------------------------------
    variants = setup.length_variants(LENGTH_REPEATS)
    enc_v = setup.encode(replace(serve, max_length=None), variants)
    res_v = setup.score(setup.scoring, enc_v.seqs, serve.padding_side, serve.batch_size)
    k = len(LENGTH_REPEATS)
    lengths = [enc_v.seqs[i: i + k] for i in range(0, len(variants), k)]
    slope = _slope([[len(s) for s in group] for group in lengths],
                   [res_v.scores[i: i + k] for i in range(0, len(variants), k)])
    m.metric("length_slope", slope, bad="none", ratchet=False)
    _judge_slope(m, "length_slope_abs", slope, slope_max, "reward model")


def _finite(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _call(setup: RewardSetup, samples: list[Sample]) -> list[float] | str:
    """The function's rewards, or why its output is unusable."""
    assert setup.function is not None
    out = setup.function(prompts=[s.prompt for s in samples],
                         completions=[s.completion for s in samples])
    try:
        values = [float(v) for v in out]
    except (TypeError, ValueError):
        return f"returns {type(out).__name__}, not one float per completion"
    if len(values) != len(samples):
        return f"returns {len(values)} rewards for {len(samples)} completions"
    return values


def _function_part(m: Measurement, setup: RewardSetup, limits: dict[str, float],
                   slope_max: float | None) -> None:
    name = setup.function_name
    batched = _call(setup, setup.samples)
    if isinstance(batched, str):
        m.fail("function_output", f"{name} {batched}")
        return
    if not all(map(_finite, batched)):
        m.fail("nonfinite_reward", f"{name} returns NaN/Inf rewards")
        return
    singles: list[float] = []
    for s in setup.samples:
        one = _call(setup, [s])
        if isinstance(one, str):
            m.fail("function_output", f"{name} {one}")
            return
        singles += one
    rev = _call(setup, setup.samples[::-1])
    err = max(abs(a - b) for a, b in zip(batched, singles, strict=True))
    if not isinstance(rev, str):
        err = max(err, max(abs(a - b) for a, b in zip(batched, rev[::-1], strict=True)))
    if setup.function_matches_model and setup.trained_dir is not None:
        compare_with_model(m, setup, batched, limits["score_max_abs"])
    elif setup.trained_dir is not None:
        m.note(f"{name} is declared another reward than the model's "
               "(function_matches_model: false): not compared with its scores")
    m.metric("function_batch_max_abs", err, threshold=limits["batch_max_abs"])
    if err > limits["batch_max_abs"]:
        m.fail("batch_variance", f"{name}: rewards depend on the batch (alone vs batched, "
               f"another order): up to {err:.3g}", metric="function_batch_max_abs")
    variants = setup.length_variants(LENGTH_REPEATS)
    values = _call(setup, variants)
    if isinstance(values, str):
        m.fail("function_output", f"{name} {values}")
        return
    k = len(LENGTH_REPEATS)
    tok = setup.tokenizer
    lengths = [[len(tok(v.completion, add_special_tokens=False)["input_ids"]) if tok is not None
                else len(v.completion.split()) for v in variants[i: i + k]]
               for i in range(0, len(variants), k)]
    slope = _slope(lengths, [values[i: i + k] for i in range(0, len(values), k)])
    m.metric("function_length_slope", slope, bad="none", ratchet=False)
    _judge_slope(m, "function_length_slope_abs", slope, slope_max, str(name))


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("reward_parity")
    setup = ctx.reward
    if setup is None:
        return m.skip("no causal_lm.reward block: the reward is not gated")
    from paritygate.sections.reward_parity import RewardSpec

    block = RewardSpec.of(ctx.spec)
    slope_max = block.length_slope_max if block is not None else None
    if setup.generated:  # the greedy generation other LM checks share
        greedy = ctx.generations.greedy("hf")
        assert greedy is not None  # the HF engine always generates (only a dump may not)
        setup = setup.with_generated(greedy, [p.id for p in ctx.probes], ctx.training.tokenizer)
        m.note(f"samples: the HF engine's greedy continuations of {len(setup.samples)} probes")
        if not setup.samples:
            return m.skip("every greedy continuation of the probes is empty: nothing to score")
    limits = _limits(setup, thresholds, m)
    m.metric("samples", len(setup.samples), bad="none", ratchet=False)
    if setup.model_dir is not None:
        _model_part(m, setup, limits, slope_max)
    if setup.function is not None:
        _function_part(m, setup, limits, slope_max)
    return m


CHECK = CheckSpec(
    id="reward_parity",
    summary="reward: scored at serving as in training (padding, truncation, span, dtype, "
            "provenance), read at the last real token, length slope",
    measures={"causal_lm": measure},
    needs=("models", "reward"),
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("stale_reward_model", "reward_precision_undeclared", "pad_token_missing",
           "scoring_failed", "nonfinite_reward", "score_read_at_pad", "padding_side_differs",
           "truncation_differs", "scored_span_differs", "chat_template_differs", "eos_differs",
           "scores_differ", "padding_variance", "batch_variance", "length_slope",
           "function_output", "function_scores_differ", "function_rescaled"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("reward_parity", "reward_provenance",
                ("stale_reward_model", "reward_precision_undeclared"), (),
                "the scoring reward model is not the trained one's tensors",
                fix="score with the trained reward model's checkpoint (or declare its dtype: "
                    "causal_lm.reward.dtype)",
                rank=340),
    Explanation("reward_parity", "reward_read_position",
                ("pad_token_missing", "score_read_at_pad"), (),
                "the reward model reads its score at a pad, not the last real token",
                fix="save the reward model with config.pad_token_id = the tokenizer's pad id",
                rank=350),
    Explanation("reward_parity", "reward_scoring_layout",
                ("padding_side_differs", "truncation_differs", "scored_span_differs",
                 "chat_template_differs", "eos_differs"), (),
                "serving feeds the reward model other text than training scored",
                fix="score at serving with training's padding side, max length, truncation "
                    "side, span, chat template and EOS",
                rank=360),
    Explanation("reward_parity", "reward_function_differs",
                ("function_scores_differ", "function_rescaled"), (),
                "the reward function serving uses does not return the trained reward model's "
                "scores",
                fix="score with the trained reward model read at the last real token (or "
                    "declare causal_lm.reward.function_matches_model: false for another "
                    "reward)",
                rank=365),
    Explanation("reward_parity", "reward_invariance", ("padding_variance", "batch_variance"), (),
                "the reward depends on the padding or the batch it is scored in",
                rank=370),
    Explanation("reward_parity", "reward_length", ("length_slope",), (),
                "the reward grows with completion length",
                fix="read the score at the last real token, not pooled over positions",
                rank=380),
)

POSITION = 190
"""The check's place in the checklist (and in every report): the registry sorts by it."""
