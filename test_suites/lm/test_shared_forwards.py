"""The LM checks share one greedy and one sampled generation and one teacher-forced forward per
generation, and the batched paths give the per-sequence numbers they replace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _gate(demo_lm: Path, out: Path) -> Any:
    from lm_zoo import variant_config

    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, None)
    data["name"] = "lm-shared"
    return Gate(config_from_dict(data, out / "gate.yaml"))


def test_checks_share_generations_and_forwards(demo_lm: Path, tmp_path: Path) -> None:
    gate = _gate(demo_lm, tmp_path)
    ctx = gate.context
    model = ctx.training.model()
    assert ctx.engines.serves_training_model() and ctx.engines["hf"].model is model  # loaded once
    calls: list[tuple[int, ...]] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        assert gate.evaluate("logits_agreement", golden=False).status == "pass"
        after_logits = len(calls)
        assert gate.evaluate("generation_parity", golden=False).status == "pass"
        assert len(calls) == after_logits, "generation_parity ran forwards of its own"
        greedy = ctx.generations.greedy("hf")
        assert ctx.generations.teacher_forced(greedy) is ctx.generations.teacher_forced(greedy)
        assert ctx.generations.greedy("hf") is greedy
    finally:
        handle.remove()
    # The greedy generation (its KV-cache logits kept) and one batched teacher-forced forward:
    # no forward per probe and step.
    steps = max(len(o) for o in greedy.output_ids)
    assert greedy.logits is not None
    assert after_logits <= steps + 2, calls


def test_batched_paths_match_the_per_sequence_ones(demo_lm: Path, tmp_path: Path) -> None:
    import torch

    from paritygate.checks.generation_parity import GreedyRules, greedy_training_path

    ctx = _gate(demo_lm, tmp_path).context
    model = ctx.training.model()
    greedy = ctx.generations.greedy("hf")
    teacher = ctx.generations.teacher_forced(greedy)
    cached = ctx.engines["hf"].cached_logits(greedy.prompt_ids, greedy.output_ids)
    training = ctx.training.sampling.spec()
    rules = GreedyRules(ctx.serving.tokenizer, training.max_new_tokens, training.min_new_tokens,
                   list(training.stop))
    assert greedy.logits is not None
    for prompt, output, forced, cand, kept in zip(
        greedy.prompt_ids, greedy.output_ids, teacher, cached, greedy.logits, strict=True
    ):
        with torch.inference_mode():
            single = model(input_ids=torch.tensor([prompt + output])).logits[0].float().numpy()
        single = single[len(prompt) - 1 :]  # (len(output) + 1, V)
        assert forced.shape == single.shape
        assert np.abs(forced - single).max() < 1e-5
        assert np.abs(cand - single[: len(output)]).max() < 1e-5
        assert np.abs(kept - single[: len(output)]).max() < 1e-5  # the generation's own
        # The training path read from the shared forward is the step-by-step decode.
        shared_tokens, shared_margins = greedy_training_path(model, rules, prompt, forced, output)
        alone_tokens, alone_margins = greedy_training_path(model, rules, prompt)
        assert shared_tokens == alone_tokens
        assert np.allclose(shared_margins, alone_margins, atol=1e-5)
