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
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.check import CheckSpec
from paritygate.result import Measurement

if TYPE_CHECKING:
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

    reason = vllm_unavailable_reason(ctx.engine_model_dir)
    if reason is not None:
        return None, f"generation_parity with engines: [vllm] needs vLLM: {reason}"
    return "vllm", None


def measure(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("generation_parity")
    engine_name, reason = greedy_engine(ctx)
    if engine_name is None:
        return m.skip(reason or "no engine configured")
    training = ctx.training_sampling.spec()
    serving = ctx.serving_sampling.spec()
    engine_out = ctx.greedy(engine_name)
    if engine_out is None:
        return m.skip("the rollout dump holds no greedy record (temperature 0)")
    probes: list[Any] = list(ctx.probes)  # or stand-ins naming the dump's rollouts
    if engine_name == "dump" or len(probes) != len(engine_out.prompt_ids):
        from types import SimpleNamespace

        probes = [SimpleNamespace(id=f"rollout {i}") for i in range(len(engine_out.prompt_ids))]
    model = ctx.reference_model()
    tok = ctx.serving_tokenizer
    limits = ctx.served_limits(
        {"near_tie_margin": ctx.spec.near_tie_margin},
        ctx.spec.model_fields_set & {"near_tie_margin"},
    )
    tol = float(limits["near_tie_margin"] or 0.0)
    shown = f"{tol:g}" if limits.tier is None else limits.describe("near_tie_margin")
    if limits.note() is not None:
        m.note(str(limits.note()))
    rules = GreedyRules(tok, training.max_new_tokens, training.min_new_tokens,
                        list(training.stop), list(training.eos_token_ids))
    teacher = ctx.teacher_forced(engine_out)  # one batched forward, shared
    unexcused = excused = agreeing = compared = 0
    rows: list[dict[str, object]] = []
    for probe, prompt, cand, forced in zip(
        probes, engine_out.prompt_ids, engine_out.output_ids, teacher, strict=True
    ):
        ref, margins = greedy_training_path(model, rules, prompt, forced, cand)
        at = next((i for i, (r, c) in enumerate(zip(ref, cand, strict=False)) if r != c), None)
        row: dict[str, object] = {
            "probe": probe.id,
            "training_len": len(ref),
            "engine_len": len(cand),
            "first_divergence": at,
        }
        compared += max(len(ref), len(cand))
        if at is None and len(ref) == len(cand):
            agreeing += len(ref)
            rows.append(row)
            continue
        if at is None:
            at = min(len(ref), len(cand))
            agreeing += at
            row["first_divergence"] = at
            unexcused += 1
            m.fail(
                "length_drift",
                f"probe {probe.id!r}: length drift: engine stopped after {len(cand)} tokens, "
                f"training path after {len(ref)} (max_new_tokens training "
                f"{training.max_new_tokens} vs serving {serving.max_new_tokens}, stop "
                f"{training.stop} vs {serving.stop})"
            )
        else:
            agreeing += at
            row.update(
                margin=margins[at],
                training_token=tok.decode([ref[at]]),
                engine_token=tok.decode([cand[at]]),
            )
            if margins[at] < tol:
                excused += 1
                m.note(
                    f"probe {probe.id!r}: divergence at token {at} excused, near-tie "
                    f"(margin {margins[at]:.3g} < {shown})"
                )
            else:
                unexcused += 1
                m.fail(
                    "greedy_divergence",
                    f"probe {probe.id!r}: greedy decoding diverges at token {at}: training "
                    f"{tok.decode([ref[at]])!r} vs engine {tok.decode([cand[at]])!r} "
                    f"(logit margin {margins[at]:.3g} >= near-tie tolerance {shown})"
                )
        rows.append(row)
    m.metric(
        "unexcused_divergences", unexcused, threshold=thresholds["unexcused_divergences"], key=True
    )
    m.metric("excused_divergences", excused, bad="none")
    m.metric("token_agreement", agreeing / compared if compared else 1.0, bad="lower")
    m.details["probes"] = rows
    if engine_name == "endpoint":
        from paritygate.engines.openai_endpoint import server_findings

        for note in server_findings(ctx.engine(engine_name)):
            m.note(note)
    return m


CHECK = CheckSpec(
    id="generation_parity",
    summary="greedy decoding agrees between the training path and the engine",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("length_drift", "greedy_divergence"),
)

POSITION = 150
"""The check's place in the checklist (and in every report): the registry sorts by it."""
