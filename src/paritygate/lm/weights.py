"""weights_load for the causal-LM family: every safetensors tensor lands in both models.

The training model (HF ``from_pretrained`` in the training dtype) must load every
checkpoint key except the declared training-only heads (TRL's ``v_head.*``), with
no missing keys beyond tied weights, and hold exactly the file's values. The
inference engine's model must hold the same weights: an engine pointed at a
stale checkpoint is named here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paritygate.lm.hf import safetensors_files
from paritygate.result import Measurement

KNOWN_PREFIXES = {
    "module.": "the 'module.' prefix of DistributedDataParallel (strip it before saving)",
    "_orig_mod.": "the '_orig_mod.' prefix of torch.compile (save the uncompiled module)",
}


def read_state(directory: Path) -> dict[str, Any]:
    """Every tensor of a model directory's safetensors files (no code runs)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in safetensors_files(directory):
        state.update(load_file(str(path)))
    return state


def _value_mismatches(model: Any, state: Mapping[str, Any]) -> list[str]:
    """Model tensors that differ from the file's (compared in the model's dtype)."""
    import torch

    out = []
    for name, tensor in model.state_dict().items():
        if name in state:
            expected = state[name].to(tensor.dtype)
            if tensor.shape != expected.shape or not torch.equal(tensor.cpu(), expected):
                out.append(name)
    return out


def _is_head(key: str, heads: list[str]) -> bool:
    return any(key.startswith(h) for h in heads)


def measure_weights_load(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    import torch

    m = Measurement("weights_load")
    heads = list(ctx.spec.training_only_heads)
    state = read_state(ctx.model_dir)
    nonfinite = sorted(
        k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())
    )
    for name in nonfinite[:5]:
        m.fail(
            f"checkpoint tensor {name!r} has {int((~torch.isfinite(state[name])).sum())} "
            "NaN/Inf values"
        )

    model = ctx.reference_model()
    info = ctx.reference_loading_info()
    missing = sorted(info.get("missing_keys", []))
    unexpected_all = sorted(info.get("unexpected_keys", []))
    head_keys = [k for k in unexpected_all if _is_head(k, heads)]
    unexpected = [k for k in unexpected_all if not _is_head(k, heads)]
    mismatched = sorted(info.get("mismatched_keys", []))
    tied = [
        k
        for k in missing
        if k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False)
    ]
    missing = [k for k in missing if k not in tied]

    for prefix, cause in KNOWN_PREFIXES.items():
        stripped = {k[len(prefix) :] for k in unexpected if k.startswith(prefix)}
        if stripped & set(missing):
            m.fail(
                f"checkpoint keys carry {cause}: {len(stripped & set(missing))} keys match "
                "after stripping it"
            )
    if missing:
        m.fail(
            f"training model: {len(missing)} tensors missing from the checkpoint, left at "
            f"their initial values: {missing[:5]}"
        )
    undeclared = sorted({k.split(".")[0] + "." for k in unexpected})
    if unexpected:
        m.fail(
            f"training model: {len(unexpected)} unexpected checkpoint keys {unexpected[:4]} "
            f"are not in the model and not declared training-only (add {undeclared} to "
            "causal_lm.training_only_heads if they are a training head such as TRL's v_head)"
        )
    for entry in mismatched[:5]:
        m.fail(f"training model: shape mismatch {entry}")
    values = _value_mismatches(model, state)
    if values:
        m.fail(
            f"training model: {len(values)} tensors differ from the file after loading: "
            f"{values[:5]}"
        )
    for head in heads:
        if not any(k.startswith(head) for k in state):
            m.note(f"declared training-only head {head!r} has no keys in the checkpoint")
    if tied:
        m.note(f"tied weights not stored separately (fine): {tied}")

    # Inference side: the engine's weights must be this checkpoint's.
    engine_values: list[str] = []
    engine_dir = ctx.engine_model_dir
    if engine_dir != ctx.model_dir:
        from paritygate.gate import sha256_files

        engine_sha = sha256_files(safetensors_files(engine_dir))
        if engine_sha != ctx.checkpoint_sha256:
            m.fail(
                f"inference engine loads {engine_dir} (weights sha256 {engine_sha[:12]}), not "
                f"the checkpoint under test (sha256 {ctx.checkpoint_sha256[:12]}): stale or "
                "different checkpoint"
            )
    if "hf" in ctx.spec.engines:
        engine_model = ctx.engine("hf").model
        engine_values = _value_mismatches(engine_model, state)
        if engine_values:
            m.fail(
                f"inference model: {len(engine_values)} tensors differ from the checkpoint "
                f"under test: {engine_values[:5]}"
            )

    m.metric("missing_keys", len(missing), key=True, ratchet=False)
    m.metric("unexpected_keys", len(unexpected), ratchet=False)
    m.metric("shape_mismatches", len(mismatched), ratchet=False)
    m.metric("value_mismatches", len(values) + len(engine_values), ratchet=False)
    m.metric("nonfinite_tensors", len(nonfinite), ratchet=False)
    m.metric("training_only_keys", len(head_keys), bad="none", ratchet=False)
    m.metric("checkpoint_tensors", len(state), bad="none", ratchet=False)
    m.details["declared_training_heads"] = heads
    m.details["training_only_keys"] = head_keys
    return m
