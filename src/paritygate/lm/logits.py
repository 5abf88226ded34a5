"""logits_agreement for the causal-LM family: cached serving logits vs the trainer's forward.

Reference: the training model's teacher-forced forward (no cache) over each
probe prompt plus its greedy continuation. Candidate: the HF engine's model (its
dtype, its checkpoint) decoding the same tokens incrementally with a KV cache, as
serving does. Rows are the next-token distributions at every generated position.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paritygate.result import Measurement


def cached_logits(model: Any, prompt: list[int], output: list[int]) -> np.ndarray:
    """Next-token logits at the last prompt position and each generated one, via the KV
    cache: one prefill, then one token per step. Returns (len(output), V) float32."""
    import inspect

    import torch

    # transformers 5 names the cache ``cache``; 4.x ``past_key_values``.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    rows = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        rows.append(out.logits[0, -1].float())
        for tok in output[:-1]:
            out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{key: getattr(out, key)})
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows).numpy()  # (N, V)


def teacher_forced_logits(model: Any, prompt: list[int], output: list[int]) -> np.ndarray:
    """The same rows from one full forward without a cache. Returns (len(output), V)."""
    import torch

    seq = prompt + output
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float()
    return logits[len(prompt) - 1 : len(seq) - 1].numpy()  # (N, V)


def measure_logits_agreement(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    from paritygate.checks.logits_agreement import compare_logits

    m = Measurement("logits_agreement")
    if "hf" not in ctx.spec.engines:
        return m.skip("logits_agreement needs the HF engine's model (engines has no 'hf')")
    generation = ctx.greedy("hf")
    reference_model = ctx.reference_model()
    engine_model = ctx.engine("hf").model
    refs, cands, owners = [], [], []
    for probe, prompt, output in zip(
        ctx.probes, generation.prompt_ids, generation.output_ids, strict=True
    ):
        if not output:
            continue
        refs.append(teacher_forced_logits(reference_model, prompt, output))
        cands.append(cached_logits(engine_model, prompt, output))
        owners += [f"{probe.id}@{j}" for j in range(len(output))]
    if not refs:
        return m.skip("the engine generated no tokens for any probe")
    reference = np.concatenate(refs)  # (N, V)
    candidate = np.concatenate(cands)  # (N, V)
    stats = compare_logits(m, reference, candidate, thresholds)
    if stats and stats.get("max_abs", 0.0) > thresholds["max_abs_diff"]:
        m.fail(
            f"cached engine logits differ from the trainer's forward by up to "
            f"{stats['max_abs']:.3g} (engine {ctx.engine_model_dir.name} in "
            f"{ctx.spec.engine.dtype}, trainer in {ctx.spec.training.dtype}): stale checkpoint, "
            "lower precision or a cache bug"
        )
    for row in m.details.get("worst_probes", []):
        row["position"] = owners[row["probe"]]
    m.metric("rows", len(reference), bad="none", ratchet=False)
    m.details["reference"] = f"training model ({ctx.spec.training.dtype}, teacher-forced, no cache)"
    m.details["candidate"] = f"HF engine model ({ctx.spec.engine.dtype}, KV cache)"
    return m
