"""generation_parity: greedy decoding through the training path and the engine agree.

The training path decodes greedily without a cache (argmax of the training model's
full forward, the training sampling config's max_new_tokens, min_new_tokens and stop
strings); the engine decodes greedily with its cache and the serving config. While the
two agree, the training path's choice at each step is the argmax of one teacher-forced
forward over the engine's output (the prefix is the same), so that one batched forward,
shared with ``logits_agreement``, replaces the step-by-step decode; only after a
divergence or past the engine's last token does the training path decode on alone. The
first divergent position of each probe is reported; a divergence is excused only at a
near-tie, where the training path's top-2 logit margin is below ``causal_lm.near_tie_margin``
(for a copy served at a declared lower precision, its tier's margin unless the config sets one:
:func:`paritygate.metrics.tiers.tier_limits`).
The engine is the first of ``engines`` other than vLLM; with ``engines: [vllm]`` it is vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.check import CheckSpec
from paritygate.metrics.logprob_stream import DETAIL_ROWS
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.generation import Generation, SamplingSpec
    from paritygate.families.causal_lm.context import LMContext

# Greedy decoding is deterministic: any divergence that is not a near-tie is a bug.
DEFAULTS: dict[str, float] = {"unexcused_divergences": 0.0}


class GreedyRules:
    """The training sampling config's stopping rules and EOS masking for greedy decoding."""

    def __init__(self, tokenizer: Any, max_new_tokens: int, min_new_tokens: int,
                 stop: list[str], eos_ids: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        # the training config's EOS ids (a generation config's eos_token_id), else the tokenizer's
        tok_eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self.eos = set(eos_ids or tok_eos)
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.stop = stop

    def choose(self, logits: Any, step: int) -> tuple[int, float]:
        """Argmax and top-1 minus top-2 margin of one step's (V,) logits."""
        row = np.array(logits, dtype=np.float32)
        if step < self.min_new_tokens and self.eos:
            row[sorted(self.eos)] = -np.inf
        two = np.argpartition(-row, 1)[:2]
        first, second = sorted(two.tolist(), key=lambda t: (-row[t], t))
        return first, float(row[first] - row[second])

    def stops(self, tokens: list[int]) -> bool:
        """Decoding ends after ``tokens`` (EOS, a completed stop string or the length limit)."""
        if len(tokens) >= self.max_new_tokens or tokens[-1] in self.eos:
            return True
        return bool(self.stop) and any(s in self.tokenizer.decode(tokens) for s in self.stop)


@dataclass(frozen=True)
class GreedyRows(Record):
    """A row per compared sequence: where the two greedy decodes part and why."""

    probes: list[dict[str, object]]


def greedy_training_path(
    model: Any,
    rules: GreedyRules,
    prompt: list[int],
    teacher: Any = None,
    engine_tokens: list[int] | None = None,
) -> tuple[list[int], list[float]]:
    """The training path's greedy tokens and top-2 logit margins. ``teacher`` holds the
    training model's logits after ``prompt + engine_tokens[:j]`` for each ``j`` (one
    teacher-forced forward): they give every step while the path follows the engine's
    tokens; after that (or without ``teacher``) the path decodes alone, one full forward
    per token (no cache)."""
    import torch

    tokens: list[int] = []
    margins: list[float] = []
    if rules.max_new_tokens <= 0:
        return tokens, margins
    while True:
        step = len(tokens)
        if teacher is not None and engine_tokens is not None and (
            step <= len(engine_tokens) and tokens == engine_tokens[:step]
        ):
            logits = teacher[step]
        else:
            with torch.inference_mode():
                ids = torch.tensor([prompt + tokens])
                logits = model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu().numpy()
        token, margin = rules.choose(logits, step)
        tokens.append(token)
        margins.append(margin)
        if rules.stops(tokens):
            return tokens, margins


def greedy_engine(ctx: LMContext) -> tuple[str | None, str | None]:
    """The engine that decodes greedily: the first of ``engines`` other than vLLM, else vLLM
    (``engines: [vllm]``), with the reason when vLLM cannot serve here."""
    engine_name = next((e for e in ctx.spec.engines if e != "vllm"), None)
    if engine_name is not None or "vllm" not in ctx.spec.engines:
        return engine_name, None
    from paritygate.engines.vllm_engine import vllm_unavailable_reason

    reason = vllm_unavailable_reason(ctx.serving.model_dir)
    if reason is not None:
        return None, f"generation_parity with engines: [vllm] needs vLLM: {reason}"
    return "vllm", None


@dataclass
class _Tally:
    """Counts and rows over every compared sequence; a dump's rows and messages are capped
    (:data:`~paritygate.metrics.logprob_stream.DETAIL_ROWS` rows, :data:`DUMP_MESSAGES`
    messages per kind), its counts never."""

    cap: bool = False
    unexcused: int = 0
    excused: int = 0
    agreeing: int = 0
    compared: int = 0
    sequences: int = 0
    rows: list[dict[str, object]] = field(default_factory=list)
    said: dict[str, int] = field(default_factory=dict)

    def row(self, row: dict[str, object]) -> None:
        self.sequences += 1
        if not self.cap or len(self.rows) < DETAIL_ROWS:
            self.rows.append(row)

    def say(self, m: Measurement, kind: str, message: str) -> None:
        """``m.fail(kind, message)`` (``excused``: ``m.note``), the first ones of a dump."""
        seen = self.said.get(kind, 0)
        self.said[kind] = seen + 1
        if self.cap and seen >= DUMP_MESSAGES:
            return
        if kind == "excused":
            m.note(message)
        else:
            m.fail(kind, message)

    def close(self, m: Measurement) -> None:
        for kind, seen in self.said.items():
            if self.cap and seen > DUMP_MESSAGES:
                more = f"{seen - DUMP_MESSAGES} more rollouts of the dump alike"
                if kind == "excused":
                    m.note(more)
                else:
                    m.fail(kind, more)
        if self.cap and self.sequences > len(self.rows):
            m.note(f"details list the first {len(self.rows)} of the dump's {self.sequences} "
                   "greedy rollouts; the metrics count them all")


DUMP_MESSAGES = 20
"""Divergence messages (per kind) a dump's audit writes before counting the rest in one."""

TEACHER_LOGITS = 2**24
"""Teacher-forced logits (tokens x vocabulary) held at a time for a dump: 64 MiB of float32."""


@dataclass(frozen=True)
class _Setup:
    rules: GreedyRules
    tol: float
    shown: str
    training: SamplingSpec
    serving: SamplingSpec


def measure(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("generation_parity")
    engine_name, reason = greedy_engine(ctx)
    if engine_name is None:
        return m.skip(reason or "no engine configured")
    if engine_name == "dump" and ctx.generations.dump_summary.greedy.records == 0:
        return m.skip("the rollout dump holds no greedy record (temperature 0)")
    training = ctx.training.sampling.spec()
    limits = ctx.served_limits(
        {"near_tie_margin": ctx.spec.near_tie_margin},
        ctx.spec.model_fields_set & {"near_tie_margin"},
    )
    tol = float(limits["near_tie_margin"] or 0.0)
    shown = f"{tol:g}" if limits.tier is None else limits.describe("near_tie_margin")
    if limits.note() is not None:
        m.note(str(limits.note()))
    rules = GreedyRules(ctx.serving.tokenizer, training.max_new_tokens, training.min_new_tokens,
                        list(training.stop), list(training.eos_token_ids))
    setup = _Setup(rules, tol, shown, training, ctx.serving.sampling.spec())
    tally = _Tally(cap=engine_name == "dump")
    if engine_name == "dump":
        _compare_dump(m, ctx, setup, tally)
    else:
        engine_out = ctx.generations.greedy(engine_name)
        probes: list[str] = [p.id for p in ctx.probes]
        if len(probes) != len(engine_out.prompt_ids):  # stand-ins naming the rollouts
            probes = [f"rollout {i}" for i in range(len(engine_out.prompt_ids))]
        teacher = ctx.generations.teacher_forced(engine_out)  # one batched forward, shared
        _compare(m, ctx, setup, tally, probes, engine_out, teacher)
    tally.close(m)
    m.metric(
        "unexcused_divergences", tally.unexcused,
        threshold=thresholds["unexcused_divergences"], key=True,
    )
    m.metric("excused_divergences", tally.excused, bad="none")
    m.metric("token_agreement", tally.agreeing / tally.compared if tally.compared else 1.0,
             bad="lower")
    m.record(GreedyRows(tally.rows))
    if engine_name == "endpoint":
        from paritygate.engines.openai_endpoint import server_findings

        for note in server_findings(ctx.engines[engine_name]):
            m.note(note)
    return m


def _compare_dump(m: Measurement, ctx: LMContext, setup: _Setup, tally: _Tally) -> None:
    """A dump's greedy records batch by batch: each batch's teacher-forced logits are
    dropped once its rows are compared (never memoised on the context)."""
    vocab = max(1, ctx.generations.dump_summary.vocab_size or 1)
    for batch in ctx.generations.dump_batches(greedy=True):
        for start, stop in batch.spans(TEACHER_LOGITS // vocab):
            part = batch.rows(start, stop)
            teacher = ctx.generations.teacher_forced_once(part)
            names = [f"rollout {tally.sequences + i}" for i in range(stop - start)]
            _compare(m, ctx, setup, tally, names, part, teacher)


def _compare(m: Measurement, ctx: LMContext, setup: _Setup, tally: _Tally, names: list[str],
             engine_out: Generation, teacher: list[np.ndarray]) -> None:
    """Each sequence's training path against the engine's tokens: first divergence, excused
    at a near-tie, else a failure of its kind."""
    model, tok, training, serving = (ctx.training.model(), ctx.serving.tokenizer,
                                     setup.training, setup.serving)
    for name, prompt, cand, forced in zip(
        names, engine_out.prompt_ids, engine_out.output_ids, teacher, strict=True
    ):
        ref, margins = greedy_training_path(model, setup.rules, prompt, forced, cand)
        at = next((i for i, (r, c) in enumerate(zip(ref, cand, strict=False)) if r != c), None)
        row: dict[str, object] = {
            "probe": name,
            "training_len": len(ref),
            "engine_len": len(cand),
            "first_divergence": at,
        }
        tally.compared += max(len(ref), len(cand))
        if at is None and len(ref) == len(cand):
            tally.agreeing += len(ref)
            tally.row(row)
            continue
        if at is None:
            at = min(len(ref), len(cand))
            tally.agreeing += at
            row["first_divergence"] = at
            tally.unexcused += 1
            tally.say(
                m, "length_drift",
                f"probe {name!r}: length drift: engine stopped after {len(cand)} tokens, "
                f"training path after {len(ref)} (max_new_tokens training "
                f"{training.max_new_tokens} vs serving {serving.max_new_tokens}, stop "
                f"{training.stop} vs {serving.stop})"
            )
        else:
            tally.agreeing += at
            row.update(
                margin=margins[at],
                training_token=tok.decode([ref[at]]),
                engine_token=tok.decode([cand[at]]),
            )
            if margins[at] < setup.tol:
                tally.excused += 1
                tally.say(
                    m, "excused",
                    f"probe {name!r}: divergence at token {at} excused, near-tie "
                    f"(margin {margins[at]:.3g} < {setup.shown})"
                )
            else:
                tally.unexcused += 1
                tally.say(
                    m, "greedy_divergence",
                    f"probe {name!r}: greedy decoding diverges at token {at}: training "
                    f"{tok.decode([ref[at]])!r} vs engine {tok.decode([cand[at]])!r} "
                    f"(logit margin {margins[at]:.3g} >= near-tie tolerance {setup.shown})"
                )
        tally.row(row)


CHECK = CheckSpec(
    id="generation_parity",
    summary="greedy decoding agrees between the training path and the engine",
    measures={"causal_lm": measure},
    downstream=True,
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("length_drift", "greedy_divergence"),
)

POSITION = 150
"""The check's place in the checklist (and in every report): the registry sorts by it."""
