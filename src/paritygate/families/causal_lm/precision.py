"""The causal-LM family's per-layer precision subject: its model, prompts and coverage.

The model is loaded whole, or built with its layers streamed from the safetensors
(``precision.streaming``, :mod:`paritygate.precision.streaming`); either way it is
compared with the checkpoint first, so a tensor left at random init or a checkpoint key
unused (training-only heads excepted) refuses the measurement by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from paritygate.engines.generation import left_pad
from paritygate.engines.hf_loading import load_causal_lm, safetensors_files

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.precision.subject import PrecisionSubject

TrainingLoader = Callable[[], "tuple[nn.Module, dict[str, object]]"]
"""Returns the training-side model and its loading info, loaded once by the caller."""


def precision_subject(
    spec: CausalLMSpec, *, name: str, model_dir: Path, prompts: list[list[int]],
    pad_id: int | None, streaming: bool | Literal["auto"], trust_remote_code: bool,
    training: TrainingLoader,
) -> PrecisionSubject:
    """Probe prompts (``prompts``, training tokenizer) as left-padded batches of input ids;
    ``refusal`` set on random init. ``training`` is used when the training model is already
    fp32 on one device, so no second copy is loaded."""
    from paritygate.precision.hf import checkpoint_coverage
    from paritygate.precision.streaming import build_streamed, stream_decision, streaming_note
    from paritygate.precision.subject import PrecisionSubject

    pad = 0 if pad_id is None else pad_id
    batches = []
    for start in range(0, len(prompts), 4):
        ids, mask = left_pad(prompts[start : start + 4], pad)  # (B, T), (B, T)
        batches.append(((), {"input_ids": ids, "attention_mask": mask}))

    files = safetensors_files(model_dir)
    stream, reason = stream_decision(streaming, files)
    notes = []
    if stream:  # layers read one at a time (models larger than memory)
        from transformers import AutoModelForCausalLM

        model, streamer = build_streamed(
            AutoModelForCausalLM, model_dir, files, trust_remote_code
        )
        coverage, notes = streamer.coverage, [streaming_note(streamer, reason)]
    else:
        if spec.training.dtype == "float32" and spec.training.device_map is None:
            # the training model is already fp32 on one device; casts are undone after each pass
            model, info = training()
        else:
            model, info = load_causal_lm(
                model_dir, "float32", trust_remote_code=trust_remote_code
            )
        coverage = checkpoint_coverage(model, files, info)
    heads = tuple(spec.training_only_heads)
    coverage = dataclasses.replace(
        coverage, unused=[k for k in coverage.unused if not k.startswith(heads)]
    )
    return PrecisionSubject(
        name=name,
        build_model=lambda: model.eval(),
        batches=batches,
        select_output=lambda out: out.logits,
        refusal=coverage.refusal(
            "the architecture (config.json)", heads_key="causal_lm.training_only_heads"
        ),
        streamed=stream,
        extra={"notes": notes},
    )
