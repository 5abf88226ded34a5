"""batch_invariance: a probe's engine numbers do not depend on the batch it is served in.

Each probe is first run alone (batch 1): its greedy tokens, and its raw log-probs of those
tokens teacher-forced (the fixed completion). Then every probe again, in four batched
variants: ``batched`` (the engine's ``batch_size``, in order), ``pairs`` (batches of two),
``longer_mates`` (all probes with a batch-mate longer than any of them: more left padding for
every row) and ``reversed`` (all probes, other order). Each variant is one batched forward and
one batched greedy decode. The largest log-prob difference from the alone run and the greedy
divergences are reported, with whether everything is bitwise identical.

``causal_lm.serving.batch_invariant: true`` (the engine is claimed invariant, as vLLM's
batch-invariant mode or a matched trainer provides) requires bitwise equality. Otherwise the
precision tier (:mod:`paritygate.metrics.tiers`, the engine's dtype on both sides, or
``causal_lm.precision_tier``) bounds the difference: a reduction whose order depends on the
batch shape moves numbers by rounding, which is reported as noise with its size. A greedy
divergence is excused only where the alone run's top-2 margin is below the measured noise
(twice the largest log-prob difference) or ``causal_lm.near_tie_margin``, and never when
invariance is declared.

Where a difference is found, the batch layout names its cause: a right-padded batch (a
shorter row continues from a pad), position ids not counted from the attention mask, or no
attention mask passed. The HF engine lays batches out as ``causal_lm.engine.collate`` does
(default: the serving tokenizer's padding side, mask passed, positions from the mask).

Policy artifacts that take a batch (ONNX with a dynamic batch axis, TorchScript, ``.pt2``) are
checked the same way on their served outputs (:mod:`paritygate.checks._batch_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import REPLAY, ROLLOUT, Explanation
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._batch_policy import measure_policy
from paritygate.metrics.tiers import PRECISION_TIERS
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.batching import BatchRunner, Layout
    from paritygate.families.causal_lm.context import LMContext

# The fp32/fp32 tier's worst-token bound (sources in paritygate.metrics.tiers); at run time the
# engine dtype's tier replaces it unless the config sets it; 0 when invariance is declared.
DEFAULTS: dict[str, float] = {
    "logprob_max_abs_diff": PRECISION_TIERS["fp32/fp32"]["delta_max_abs"],
    # Greedy decoding of one prompt must not depend on its batch outside measured near-ties.
    "greedy_divergences": 0.0,
    # Policy artifacts: logits_agreement's fp32 budget (~2e-6 noise on the demo, 10x above it);
    # a declared artifact_dtype's tier replaces it.
    "output_max_abs_diff": 2e-5,
    # preprocessing_parity's budget for one normalisation computed twice.
    "preprocessed_max_abs_diff": 1e-5,
}

_DECLARED_KEY = "causal_lm.serving.batch_invariant"

KINDS = ("right_padding", "position_ids_not_from_mask", "mask_not_passed", "not_bitwise",
         "batch_dependent", "batch_statistics", "preprocessing_batch_dependent",
         "nonfinite_output")

_CAUSES = {
    "right_padding": "the batch is right-padded: a shorter row's next token is read after its "
                     "pads, so its continuation depends on its batch-mates' lengths",
    "position_ids_not_from_mask": "position ids are not counted from the attention mask: a "
                                  "left-padded row's tokens sit at positions shifted by its "
                                  "padding",
    "mask_not_passed": "no attention mask is passed: every row attends to its pads",
}


@dataclass(frozen=True)
class EngineBatchRecord(Record):
    """What the check records besides its metrics (causal LM): a row per batch variant, the
    tier, the engine and the forwards it took."""

    variants: list[dict[str, object]]
    tier: dict[str, object]
    engine: str
    batched_forwards: int
    alone_forwards: int
    declared_invariant: bool


def variants(count: int, batch_size: int) -> dict[str, list[list[int]]]:
    """Batches of probe indices per variant; ``-1`` stands for the longer batch-mate."""
    every = list(range(count))
    return {
        "batched": [every[i : i + batch_size] for i in range(0, count, batch_size)],
        "pairs": [every[i : i + 2] for i in range(0, count, 2)],
        "longer_mates": [[*every, -1]],
        "reversed": [every[::-1]],
    }


def _runner(ctx: LMContext) -> tuple[BatchRunner | None, str, str | None]:
    """The engine to re-batch: HF, else an endpoint, else vLLM (never a dump)."""
    engines = ctx.spec.engines
    if "hf" in engines:
        from paritygate.engines.batching import Collate, HFBatchRunner, collate_padded
        from paritygate.engines.hf_generate import HFGenerateEngine
        from paritygate.imports import guard_user_code, import_callable

        eng = ctx.engines["hf"]
        assert isinstance(eng, HFGenerateEngine)
        collate: Collate = collate_padded
        if ctx.spec.engine.collate:
            key = "causal_lm.engine.collate"
            collate = guard_user_code(
                import_callable(ctx.spec.engine.collate, ctx.config.path, key),
                ctx.config.path, key,
            )
        return HFBatchRunner(eng.model, collate, eng.pad_token_id, eng.padding_side), "hf", None
    if "endpoint" in engines:
        from paritygate.engines.batching import EndpointBatchRunner
        from paritygate.engines.openai_endpoint import EndpointEngine

        endpoint = ctx.engines["endpoint"]
        assert isinstance(endpoint, EndpointEngine)
        return EndpointBatchRunner(endpoint), "endpoint", None
    if "vllm" in engines:
        from paritygate.engines.batching import VLLMBatchRunner
        from paritygate.engines.vllm_engine import VLLMEngine, vllm_unavailable_reason

        reason = vllm_unavailable_reason(ctx.serving.model_dir)
        if reason is not None:
            return None, "vllm", f"batch_invariance with engines: [vllm] needs vLLM: {reason}"
        vllm = ctx.engines["vllm"]
        assert isinstance(vllm, VLLMEngine)
        return VLLMBatchRunner(vllm), "vllm", None
    return None, "dump", "a rollout dump cannot be served in other batches (engines: [dump])"


def bound(ctx: LMContext, thresholds: Thresholds, declared: bool) -> tuple[str, float]:
    """The tier name and the largest log-prob difference allowed."""
    from paritygate.metrics.tiers import tier_for

    if declared:
        return "bitwise (causal_lm.serving.batch_invariant)", 0.0
    if thresholds.is_set("logprob_max_abs_diff"):
        return "thresholds.batch_invariance", float(thresholds["logprob_max_abs_diff"])
    if ctx.spec.precision_tier in PRECISION_TIERS:
        key = str(ctx.spec.precision_tier)
        return key, PRECISION_TIERS[key]["delta_max_abs"]
    key, tier = tier_for(ctx.spec.engine.dtype, ctx.spec.engine.dtype)
    return key, tier["delta_max_abs"]


def layout_causes(found: Layout | None) -> list[str]:
    """The finding kinds a batch layout explains, in :data:`KINDS` order."""
    if found is None:
        return []
    causes = []
    if found.right_padded:
        causes.append("right_padding")
    if not found.positions_from_mask:
        causes.append("position_ids_not_from_mask")
    if not found.mask_passed and len(set(found.starts)) > 1:
        causes.append("mask_not_passed")
    return causes


@dataclass(frozen=True)
class Divergence:
    """A greedy decode that left the alone run's tokens."""

    variant: str
    probe: str
    at: int
    """Index of the first differing token."""
    margin: float
    """The alone run's top-2 margin there (``inf`` past its end)."""


@dataclass(frozen=True)
class Sweep:
    """Every probe alone and in each batched variant, compared."""

    rows: list[dict[str, object]]
    """Per variant: batch sizes, largest log-prob difference, greedy divergences."""
    worst: tuple[float, str, str]
    """Largest log-prob difference, its variant and probe."""
    divergences: list[Divergence]
    batched_forwards: int


def _first_difference(tokens: list[int], expected: list[int]) -> int:
    return next((j for j, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b),
                min(len(tokens), len(expected)))


def sweep(runner: BatchRunner, prompts: list[list[int]], probes: list[str], filler: list[int],
          batch_size: int, max_new_tokens: int, eos: set[int]) -> Sweep:
    """Run each prompt alone, then in every :func:`variants` layout, and compare."""
    alone = [runner.greedy([p], max_new_tokens, eos)[0] for p in prompts]
    completions = [tokens for tokens, _ in alone]
    alone_lp = [runner.score([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    rows: list[dict[str, object]] = []
    divergences: list[Divergence] = []
    worst = (0.0, "", "")
    forwards = 0
    for name, batches in variants(len(prompts), batch_size).items():
        diff, greedy_diff = 0.0, 0
        for batch in batches:
            batch_prompts = [prompts[i] if i >= 0 else filler for i in batch]
            scored = runner.score(batch_prompts, [completions[i] if i >= 0 else [] for i in batch])
            decoded = runner.greedy(batch_prompts, max_new_tokens, eos)
            forwards += 1
            for i, lp, (tokens, _) in zip(batch, scored, decoded, strict=True):
                if i < 0:
                    continue
                gap = float(np.max(np.abs(lp - alone_lp[i]))) if lp.size else 0.0
                gap = gap if np.isfinite(gap) else float("inf")
                if gap > worst[0]:
                    worst = (gap, name, probes[i])
                diff = max(diff, gap)
                if tokens != completions[i]:
                    greedy_diff += 1
                    at = _first_difference(tokens, completions[i])
                    margins = alone[i][1]
                    divergences.append(Divergence(
                        name, probes[i], at, margins[at] if at < len(margins) else float("inf")))
        rows.append({"variant": name, "batches": [len(b) for b in batches],
                     "max_abs_diff": diff, "greedy_divergences": greedy_diff})
    return Sweep(rows, worst, divergences, forwards)


def verdict(m: Measurement, result: Sweep, *, limit: float, tier_name: str, declared: bool,
            causes: list[str], near_tie_margin: float, dtype: str,
            greedy_threshold: float) -> None:
    """Record the metrics and the finding (or noise note) of a :class:`Sweep` on ``m``."""
    max_diff, variant_at, probe_at = result.worst
    bitwise = max_diff == 0.0 and not result.divergences
    noise = 2 * max_diff if max_diff <= limit else 0.0
    excusable = 0.0 if declared else max(near_tie_margin, noise)
    unexcused = [d for d in result.divergences if not d.margin < excusable]
    m.metric("logprob_max_abs_diff", max_diff, threshold=limit, unit="nats", key=True)
    m.metric("greedy_divergences", len(unexcused), threshold=greedy_threshold)
    m.metric("bitwise_identical", bitwise, bad="none", ratchet=False)
    where = (f"largest log-prob difference {max_diff:.3g} nats ({variant_at}, probe "
             f"{probe_at!r}) vs alone" if max_diff > 0 else "log-probs identical")
    if unexcused:
        first = unexcused[0]
        where += (f"; {len(unexcused)} greedy divergence(s), first probe {first.probe!r} in "
                  f"{first.variant} at token {first.at} (alone margin {first.margin:.3g})")
    failing = max_diff > limit or bool(unexcused)
    metric = "logprob_max_abs_diff" if max_diff > limit else None
    if failing and causes:
        for kind in causes:
            m.fail(kind, f"batch-dependent results: {_CAUSES[kind]} ({where})", metric=metric)
    elif declared and not bitwise:
        m.fail("not_bitwise",
               f"not bitwise batch invariant, as {_DECLARED_KEY} declares: {where}",
               metric="logprob_max_abs_diff" if max_diff > 0 else None)
    elif failing:
        m.fail("batch_dependent",
               f"results depend on the batch beyond the {tier_name} bound {limit:.3g}: {where}",
               metric=metric)
    elif not bitwise:
        m.note(f"batch-dependent rounding in {dtype} (noise, within the {tier_name} bound "
               f"{limit:.3g}): {where}; {len(result.divergences)} greedy divergence(s) at "
               "near-ties excused")
    if causes and not failing:
        m.note("the batch layout has " + ", ".join(causes).replace("_", " ")
               + ", which does not move this model's numbers (positions enter only "
               "relatively, or no row is padded)")


def measure(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("batch_invariance")
    runner, engine_name, reason = _runner(ctx)
    if runner is None:
        return m.skip(reason or "no engine configured")
    sampling = ctx.serving.sampling.spec()
    if sampling.max_new_tokens <= 0:
        return m.skip("the serving config's max_new_tokens is 0: nothing to decode")
    eos_id = ctx.serving.tokenizer.eos_token_id
    eos = set(sampling.eos_token_ids) or ({eos_id} if eos_id is not None else set())
    encoded = list(zip(ctx.probes, ctx.serving.prompts, strict=True))
    empty = [p.id for p, ids in encoded if not ids]
    prompts = [ids for _, ids in encoded if ids]
    probes = [p.id for p, ids in encoded if ids]
    if not prompts:
        return m.skip("every probe encodes to no serving tokens: nothing to batch")
    if empty:
        m.note(f"probes with no serving tokens left out: {', '.join(empty)}")
    declared = bool(ctx.spec.serving.batch_invariant)
    tier_name, limit = bound(ctx, thresholds, declared)
    longest = max(prompts, key=len)
    # longer than every probe (up to max_prompt_tokens): more padding for each row
    filler = longest + longest[: max(0, min(8, ctx.spec.max_prompt_tokens - len(longest)))]
    served_len = getattr(runner, "max_model_len", None)  # a server's context, where it says
    if isinstance(served_len, int):
        if len(longest) + sampling.max_new_tokens >= served_len:
            return m.skip(f"the server's max_model_len {served_len} is under the longest probe "
                          "plus max_new_tokens: its rows cannot be scored within its context "
                          "(sampling_config: server_max_model_len)")
        filler = filler[: max(len(longest), served_len - sampling.max_new_tokens - 1)]
    result = sweep(runner, prompts, probes, filler, ctx.spec.engine.batch_size,
                   sampling.max_new_tokens, eos)
    m.record(EngineBatchRecord(result.rows, {"name": tier_name, "logprob_max_abs_diff": limit},
                               engine_name, result.batched_forwards, len(prompts), declared))
    from paritygate.engines.batching import HFBatchRunner

    # HF: the layout of the batch with the most padding names the cause of a difference
    found = runner.batch([*prompts, filler])[1] if isinstance(runner, HFBatchRunner) else None
    verdict(m, result, limit=limit, tier_name=tier_name, declared=declared,
            causes=layout_causes(found), near_tie_margin=ctx.spec.near_tie_margin,
            dtype=str(ctx.spec.engine.dtype),
            greedy_threshold=float(thresholds["greedy_divergences"]))
    return m


CHECK = CheckSpec(
    id="batch_invariance",
    summary="a probe's engine log-probs and greedy tokens do not depend on its batch",
    measures={"causal_lm": measure, "policy": measure_policy},
    downstream=True,
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=KINDS,
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("batch_invariance", "batch_layout",
                ("right_padding", "position_ids_not_from_mask", "mask_not_passed"),
                ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement"),
                "the engine lays batches out so that a row's numbers depend on its batch-mates",
                fix="left-pad batches, pass the attention mask and count position ids from it",
                rank=320),
    Explanation("batch_invariance", "batch_statistics_in_serving",
                ("preprocessing_batch_dependent",),
                ("preprocessing_parity", "rollout_parity", "serving_replay"),
                "serving preprocessing normalises each row with its batch's statistics",
                fix="normalise with fixed statistics (the training run's), never the batch's",
                only_if=(*ROLLOUT, *REPLAY), rank=255),
)

POSITION = 160
"""The check's place in the checklist (and in every report): the registry sorts by it."""
