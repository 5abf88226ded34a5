"""The causal-LM family's per-layer precision subject: its model, prompts and coverage.

The model is loaded whole, or built with its layers streamed from the safetensors
(``precision.streaming``, :mod:`paritygate.precision.streaming`); either way it is
compared with the checkpoint first, so a tensor left at random init or a checkpoint key
unused (training-only heads excepted) refuses the measurement by name.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from paritygate.engines.generation import left_pad
from paritygate.engines.hf_loading import load_causal_lm, safetensors_files

if TYPE_CHECKING:
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.precision.subject import PrecisionSubject


def precision_subject(
    spec: CausalLMSpec, training: LMSide, *, name: str, streaming: bool | Literal["auto"],
) -> PrecisionSubject:
    """The training side's probe prompts as left-padded batches of input ids; ``refusal``
    set on random init. The side's own model is used when it is already fp32 on one device,
    so no second copy is loaded."""
    from paritygate.precision.hf import checkpoint_coverage
    from paritygate.precision.streaming import build_streamed, stream_decision, streaming_note
    from paritygate.precision.subject import PrecisionSubject

    pad, prompts = training.pad_id, training.prompts
    model_dir, trust_remote_code = training.model_dir, training.trust_remote_code
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
            model, info = training.model(), training.loading_info()
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
