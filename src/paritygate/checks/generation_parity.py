"""generation_parity: greedy decoding through the training path and the engine agree.

The training path decodes step by step without a cache (a full teacher-forced
forward per new token, argmax, the training sampling config's max_new_tokens,
min_new_tokens and stop strings); the engine decodes greedily with its cache and
the serving config. The first divergent position of each probe is reported; a
divergence is excused only at a near-tie, where the training path's top-2 logit
margin is below ``causal_lm.near_tie_margin``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paritygate.check import CheckSpec
from paritygate.result import Measurement

# Greedy decoding is deterministic: any divergence that is not a near-tie is a bug.
DEFAULTS: dict[str, float] = {"unexcused_divergences": 0.0}


def greedy_training_path(
    model: Any,
    tokenizer: Any,
    prompt: list[int],
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    stop: list[str],
) -> tuple[list[int], list[float]]:
    """Argmax decoding with a full forward per step (no KV cache); returns tokens and the
    top-1 minus top-2 logit margin at each step."""
    import torch

    seq = list(prompt)
    tokens: list[int] = []
    margins: list[float] = []
    eos = tokenizer.eos_token_id
    with torch.inference_mode():
        for step in range(max_new_tokens):
            ids = torch.tensor([seq])
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()  # (V,)
            if step < min_new_tokens and eos is not None:
                logits[eos] = float("-inf")
            top = torch.topk(logits, 2)
            tokens.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(tokens[-1])
            if tokens[-1] == eos:
                break
            if stop and any(s in tokenizer.decode(tokens) for s in stop):
                break
    return tokens, margins


def measure(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("generation_parity")
    engine_name = next((e for e in ctx.spec.engines if e != "vllm"), None)
    if engine_name is None:
        return m.skip("no CPU engine configured (engines: vllm only)")
    training = ctx.training_sampling.spec()
    serving = ctx.serving_sampling.spec()
    engine_out = ctx.greedy(engine_name)
    if engine_out is None:
        return m.skip("the rollout dump holds no greedy record (temperature 0)")
    probes = list(ctx.probes)
    if engine_name == "dump" or len(probes) != len(engine_out.prompt_ids):
        from types import SimpleNamespace

        probes = [SimpleNamespace(id=f"rollout {i}") for i in range(len(engine_out.prompt_ids))]
    model = ctx.reference_model()
    tok = ctx.serving_tokenizer
    tol = ctx.spec.near_tie_margin
    unexcused = excused = agreeing = compared = 0
    rows: list[dict[str, Any]] = []
    for probe, prompt, cand in zip(
        probes, engine_out.prompt_ids, engine_out.output_ids, strict=True
    ):
        ref, margins = greedy_training_path(
            model,
            tok,
            prompt,
            max_new_tokens=training.max_new_tokens,
            min_new_tokens=training.min_new_tokens,
            stop=list(training.stop),
        )
        at = next((i for i, (r, c) in enumerate(zip(ref, cand, strict=False)) if r != c), None)
        row: dict[str, Any] = {
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
                    f"(margin {margins[at]:.3g} < {tol:g})"
                )
            else:
                unexcused += 1
                m.fail(
                    f"probe {probe.id!r}: greedy decoding diverges at token {at}: training "
                    f"{tok.decode([ref[at]])!r} vs engine {tok.decode([cand[at]])!r} "
                    f"(logit margin {margins[at]:.3g} >= near-tie tolerance {tol:g})"
                )
        rows.append(row)
    m.metric(
        "unexcused_divergences", unexcused, threshold=thresholds["unexcused_divergences"], key=True
    )
    m.metric("excused_divergences", excused, bad="none")
    m.metric("token_agreement", agreeing / compared if compared else 1.0, bad="lower")
    m.details["probes"] = rows
    return m


CHECK = CheckSpec(
    id="generation_parity",
    summary="greedy decoding agrees between the training path and the engine",
    families=("causal_lm",),
    measure=measure,
    defaults=DEFAULTS,
    marks=("fast",),
)
