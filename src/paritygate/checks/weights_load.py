"""weights_load: every checkpoint tensor lands in the model; nothing is left at random init."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from paritygate.causes import (
    DOWNSTREAM_LM,
    DOWNSTREAM_POLICY,
    Explanation,
)
from paritygate.check import CheckSpec
from paritygate.checkpoints import has_nonfinite
from paritygate.checks._artifact_origin import not_loaded_explains_provenance
from paritygate.checks._served_copy import compare_served_copy
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.hf_model.context import HFModelContext
    from paritygate.families.policy.context import PolicyContext

KNOWN_PREFIXES = {
    "module.": "the 'module.' prefix of DistributedDataParallel (strip it before saving)",
    "_orig_mod.": "the '_orig_mod.' prefix of torch.compile (save the uncompiled module)",
}


@dataclass(frozen=True)
class StateDictKey(Record):
    """The key of the training checkpoint's file that held the state dict."""

    state_dict_key: str


@dataclass(frozen=True)
class DeclaredHeads(Record):
    """The training-only heads the config declares (policy family)."""

    declared_training_heads: list[str]


@dataclass(frozen=True)
class ServedTensors(Record):
    """The served directory's tensors against the training checkpoint's (causal LM)."""

    model_dir: str
    served_from: str = field(metadata={"key": "from"})
    tensors_compared: int
    differing: dict[str, float]
    """The 20 tensors that differ most: name -> max abs difference."""
    dtype_changes: dict[str, list[str]]


@dataclass(frozen=True)
class LMHeads(Record):
    """The declared training-only heads, the keys they match and the served copy (causal LM)."""

    declared_training_heads: list[str]
    training_only_keys: list[str]
    served: ServedTensors


@dataclass(frozen=True)
class Coverage(Record):
    """The model class chosen, and the tensors left at random init or unused (HF model)."""

    model_class: str
    random_init: list[str]
    unused_keys: list[str]



def _explain(
    missing: list[str],
    unexpected: list[str],
    shapes: dict[str, tuple[int, ...]],
    file_shapes: dict[str, tuple[int, ...]],
) -> list[tuple[str, str]]:
    """Name the known causes behind a set of missing / unexpected keys: ``(kind, text)``."""
    causes = []
    for prefix, cause in KNOWN_PREFIXES.items():
        stripped = {k[len(prefix) :] for k in unexpected if k.startswith(prefix)}
        if stripped and stripped & set(missing):
            causes.append((
                "wrapper_prefix",
                f"checkpoint keys carry {cause}: {len(stripped & set(missing))} keys match "
                "after stripping it",
            ))
    for m in missing:
        same = [
            u
            for u in unexpected
            if file_shapes.get(u) == shapes.get(m)
            and not any(u.startswith(p) for p in KNOWN_PREFIXES)
        ]
        if len(same) == 1:
            causes.append((
                "key_renamed",
                f"key renamed? model expects {m!r}, checkpoint has {same[0]!r} with the same shape",
            ))
    return causes


def _side(m: Measurement, label: str, report: Any, model: Any, state: Mapping[str, Any]) -> None:
    model_state = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in model_state.items()}
    file_shapes = {k: tuple(v.shape) for k, v in state.items()}
    for kind, cause in _explain(report.missing, report.unexpected, shapes, file_shapes):
        m.fail(kind, f"{label}: {cause}")
    if report.missing:
        m.fail(
            "missing_keys",
            f"{label}: {len(report.missing)} model tensors missing from the checkpoint, left at "
            f"their initial values: {report.missing[:5]}"
        )
    if report.unexpected:
        m.fail(
            "unexpected_keys",
            f"{label}: {len(report.unexpected)} unexpected checkpoint keys (not in the model and "
            f"not a declared training head): {report.unexpected[:5]}"
        )
    for name, file_shape, model_shape in report.shape_mismatch[:5]:
        m.fail(
            "shape_mismatch",
            f"{label}: shape mismatch for {name!r}: checkpoint {list(file_shape)} vs model "
            f"{list(model_shape)}"
        )
    for name, file_dtype, model_dtype in report.dtype_mismatch[:5]:
        m.fail(
            "dtype_mismatch",
            f"{label}: dtype mismatch for {name!r}: checkpoint {file_dtype} vs model "
            f"{model_dtype} (the load casts it; the saved values are not the ones served)"
        )
    if report.load_error:
        m.fail("load_error", f"{label}: load_state_dict raised {report.load_error}")
    if report.value_mismatch:
        m.fail(
            "values_altered",
            f"{label}: {len(report.value_mismatch)} tensors differ from the file after loading "
            f"(a load hook or non-strict loader dropped or altered them): "
            f"{report.value_mismatch[:5]}"
        )
    if report.tied:
        m.note(f"{label}: tied weights not stored separately (fine): {report.tied[:5]}")
    aliases = report.aliases
    if aliases:
        groups = sorted({(a.split(".")[0], n.split(".")[0]) for a, n in aliases.items()})
        named = ", ".join(f"{a} = {n}" for a, n in groups[:4])
        m.note(f"{label}: {len(aliases)} checkpoint names store a tensor the model loads under "
               f"another name (one tensor, several names; judged by identity, fine): {named}")


def measure_policy(ctx: PolicyContext, thresholds: Mapping[str, float]) -> Measurement:
    import torch

    m = Measurement("weights_load")
    if ctx.state_dict_source is not None:
        m.note(f"training checkpoint: the state dict was read from its key "
               f"{ctx.state_dict_source!r} ({ctx.state_dict_key_reason})")
        m.record(StateDictKey(ctx.state_dict_source))
    nonfinite = sorted(
        k
        for k, v in ctx.state.items()
        if has_nonfinite(v)
    )
    for name in nonfinite[:5]:
        n_bad = int((~torch.isfinite(ctx.state[name])).sum())
        m.fail("nonfinite_checkpoint", f"checkpoint tensor {name!r} has {n_bad} NaN/Inf values")
    _side(m, "training model", ctx.reference_load, ctx.reference_model, ctx.state)
    _side(m, "inference model", ctx.heads_removed_load, ctx.heads_removed_model, ctx.state)
    tl, il = ctx.reference_load, ctx.heads_removed_load
    m.metric("missing_keys", len(tl.missing) + len(il.missing), key=True, ratchet=False)
    m.metric("unexpected_keys", len(tl.unexpected) + len(il.unexpected), ratchet=False)
    m.metric("shape_mismatches", len(tl.shape_mismatch) + len(il.shape_mismatch), ratchet=False)
    m.metric(
        "dtype_mismatches",
        len(tl.dtype_mismatch) + len(il.dtype_mismatch),
        ratchet=False,
    )
    m.metric("value_mismatches", len(tl.value_mismatch) + len(il.value_mismatch), ratchet=False)
    m.metric("nonfinite_tensors", len(nonfinite), ratchet=False)
    m.metric("checkpoint_tensors", len(ctx.state), bad="none", ratchet=False)
    m.record(DeclaredHeads(list(ctx.spec.training_heads)))
    return m


def value_mismatches(model: Any, state: Mapping[str, Any]) -> list[str]:
    """Model tensors that differ from the file's (compared in the model's dtype)."""
    import torch

    out = []
    for name, tensor in model.state_dict().items():
        if name in state:
            expected = state[name].to(tensor.dtype)
            if tensor.shape != expected.shape or not torch.equal(tensor.cpu(), expected):
                out.append(name)
    return out


def measure_causal_lm(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    import torch

    m = Measurement("weights_load")
    heads = list(ctx.spec.training_only_heads)
    state = ctx.weights.checkpoint_state()
    nonfinite = sorted(
        k for k, v in state.items() if has_nonfinite(v)
    )
    for name in nonfinite[:5]:
        m.fail(
            "nonfinite_checkpoint",
            f"checkpoint tensor {name!r} has {int((~torch.isfinite(state[name])).sum())} "
            "NaN/Inf values"
        )

    model = ctx.training.model()
    info = ctx.training.loading_info()
    missing = sorted(info.get("missing_keys", []))
    unexpected_all = sorted(info.get("unexpected_keys", []))
    head_keys = [k for k in unexpected_all if ctx.weights.is_training_only(k)]
    unexpected = [k for k in unexpected_all if not ctx.weights.is_training_only(k)]
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
                "wrapper_prefix",
                f"checkpoint keys carry {cause}: {len(stripped & set(missing))} keys match "
                "after stripping it"
            )
    if missing:
        m.fail(
            "missing_keys",
            f"training model: {len(missing)} tensors missing from the checkpoint, left at "
            f"their initial values: {missing[:5]}"
        )
    undeclared = sorted({k.split(".")[0] + "." for k in unexpected})
    if unexpected:
        m.fail(
            "unexpected_keys",
            f"training model: {len(unexpected)} unexpected checkpoint keys {unexpected[:4]} "
            f"are not in the model and not declared training-only (add {undeclared} to "
            "causal_lm.training_only_heads if they are a training head such as TRL's v_head)"
        )
    for entry in mismatched[:5]:
        m.fail("shape_mismatch", f"training model: shape mismatch {entry}")
    values = value_mismatches(model, state)
    if values:
        m.fail(
            "values_altered",
            f"training model: {len(values)} tensors differ from the file after loading: "
            f"{values[:5]}"
        )
    for head in heads:
        if not any(k.startswith(head) for k in state):
            m.note(f"declared training-only head {head!r} has no keys in the checkpoint")
    if tied:
        m.note(f"tied weights not stored separately (fine): {tied}")

    # Inference side: the served weights must be this checkpoint's, tensor by tensor.
    serving = compare_served_copy(m, ctx.weights, state)
    engine_values = _engine_values(m, ctx, state) if "hf" in ctx.spec.engines else []

    m.metric("missing_keys", len(missing), key=True, ratchet=False)
    m.metric("unexpected_keys", len(unexpected), ratchet=False)
    m.metric("shape_mismatches", len(mismatched), ratchet=False)
    m.metric("value_mismatches", len(values) + len(engine_values), ratchet=False)
    m.metric("nonfinite_tensors", len(nonfinite), ratchet=False)
    m.metric("training_only_keys", len(head_keys), bad="none", ratchet=False)
    m.metric("checkpoint_tensors", len(state), bad="none", ratchet=False)
    m.metric("serving_tensors_differing", len(serving.value_diffs), ratchet=False)
    m.metric("serving_tensors_missing", len(serving.missing), ratchet=False)
    m.metric("serving_tensors_extra", len(serving.extra), ratchet=False)
    m.metric("serving_dtype_changes", len(serving.dtype_changes), bad="none", ratchet=False)
    m.record(LMHeads(heads, head_keys, ServedTensors(
        model_dir=str(ctx.serving.model_dir), served_from=ctx.serving.key,
        tensors_compared=serving.compared,
        differing=dict(sorted(serving.value_diffs.items(), key=lambda kv: -kv[1])[:20]),
        dtype_changes={k: list(v) for k, v in list(serving.dtype_changes.items())[:20]})))
    return m


def _engine_values(m: Measurement, ctx: LMContext, state: Mapping[str, Any]) -> list[str]:
    """Tensors the loaded HF engine's model holds with other values than the served files."""
    engine_model = cast("HFGenerateEngine", ctx.engines["hf"]).model
    served = state if ctx.weights.serves_training_files() else ctx.weights.serving_state()
    engine_values: list[str] = value_mismatches(engine_model, served)
    if engine_values:
        m.fail("engine_values_altered", f"inference model: {len(engine_values)} tensors differ "
               f"from the served directory's file after loading: {engine_values[:5]}")
    return engine_values

def measure_hf_model(ctx: HFModelContext, thresholds: Mapping[str, float]) -> Measurement:
    """Every model tensor comes from the checkpoint and every checkpoint key is used."""
    m = Measurement("weights_load")
    coverage = ctx.coverage()
    for name in coverage.nonfinite[:5]:
        m.fail("nonfinite_tensor", f"checkpoint tensor {name!r} has NaN/Inf values")
    finding = coverage.finding()
    if finding is not None:
        m.fail("checkpoint_coverage", f"{ctx.class_reason}: {finding}")
    if coverage.differ:
        m.fail(
            "values_altered",
            f"{len(coverage.differ)} tensors differ from the file after loading: "
            f"{coverage.differ[:5]}"
        )
    if coverage.tied:
        m.note(f"tied weights not stored separately (fine): {coverage.tied[:5]}")
    m.metric("random_init_tensors", len(coverage.random_init), key=True, ratchet=False)
    m.metric("unused_keys", len(coverage.unused), ratchet=False)
    m.metric("value_mismatches", len(coverage.differ), ratchet=False)
    m.metric("nonfinite_tensors", len(coverage.nonfinite), ratchet=False)
    m.metric("checkpoint_tensors", coverage.checkpoint_tensors, bad="none", ratchet=False)
    m.record(Coverage(ctx.class_reason, coverage.random_init, coverage.unused))
    return m


CHECK = CheckSpec(
    id="weights_load",
    summary="every checkpoint tensor lands in the model, nothing is left at random init",
    measures={"policy": measure_policy, "causal_lm": measure_causal_lm,
              "hf_model": measure_hf_model},
    kinds=("nonfinite_checkpoint", "nonfinite_tensor", "wrapper_prefix", "key_renamed",
           "missing_keys", "unexpected_keys", "shape_mismatch", "dtype_mismatch", "load_error",
           "values_altered", "engine_values_altered", "served_tensors_missing",
           "served_tensors_extra", "served_shape_mismatch", "served_nonfinite",
           "stale_served_weights", "adapter_difference", "adapter_not_merged",
           "adapter_scale_differs", "adapter_mismatch", "adapter_on_other_base",
           "precision_change",
           "checkpoint_coverage"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("weights_load", "nonfinite_checkpoint", ("nonfinite_checkpoint",),
                DOWNSTREAM_POLICY + DOWNSTREAM_LM + ("export_integrity", "reference_parity"),
                "the checkpoint's NaN/Inf tensors propagate into every output",
                fix="do not release this checkpoint: resume from the last finite one",
                rank=10),
    Explanation("weights_load", "served_precision_change",
                ("precision_change",),
                DOWNSTREAM_LM,
                "the served copy stores its weights in a lower precision than the gate judges",
                fix="declare the served dtype (causal_lm.serving.dtype) or serve the "
                    "full-precision weights",
                rank=30),
    Explanation("weights_load", "served_copy_incomplete",
                ("served_tensors_missing", "served_tensors_extra", "served_shape_mismatch"),
                DOWNSTREAM_LM,
                "the served copy is not this checkpoint's tensors",
                fix="re-export the serving copy from the checkpoint under test "
                    "(paritygate export CONFIG)",
                rank=40),
    Explanation("weights_load", "adapter_difference",
                ("adapter_difference",),
                DOWNSTREAM_LM,
                "the served copy differs from the checkpoint by a low-rank update of its "
                "projection weights (an adapter merged otherwise)",
                fix="merge the adapter the checkpoint was trained with into the served copy at "
                    "its training scale (peft: merge_and_unload under the training LoraConfig's "
                    "r and lora_alpha), or serve the checkpoint under test",
                rank=50),
    Explanation("weights_load", "adapter_not_merged",
                ("adapter_not_merged",),
                DOWNSTREAM_LM,
                "the served copy is the base model: the training adapter is not merged",
                fix="serve the base with the adapter merged (peft: PeftModel.from_pretrained("
                    "base, adapter).merge_and_unload(), then save_pretrained), or serve the "
                    "adapter through the engine's LoRA support",
                rank=60),
    Explanation("weights_load", "adapter_scale_differs",
                ("adapter_scale_differs",),
                DOWNSTREAM_LM,
                "the served copy applies the training adapter's B @ A at another scale than "
                "the declared lora_alpha / r (details.adapter_scale_differs.served_scale: 1 "
                "when lora_alpha / r was ignored, alpha'/r when lora_alpha was edited)",
                fix="re-merge the adapter once from the base at its training scale "
                    "(merge_and_unload under the adapter's own adapter_config.json)",
                rank=70),
    Explanation("weights_load", "adapter_on_other_base",
                ("adapter_on_other_base",),
                DOWNSTREAM_LM,
                "the served copy holds the training adapter's update over another base's "
                "weights",
                fix="merge the adapter into the base it was trained on (its adapter_config.json "
                    "base_model_name_or_path), and name that base as causal_lm.model_dir; if the "
                    "served copy was trained further after merging, gate that checkpoint",
                rank=75),
    Explanation("weights_load", "adapter_mismatch",
                ("adapter_mismatch",),
                DOWNSTREAM_LM,
                "the served copy differs only on the adapter's target modules, by another "
                "update: another adapter was merged",
                fix="merge the adapter under test (causal_lm.adapter) into the served copy",
                rank=80),
    Explanation("weights_load", "stale_engine_weights",
                ("stale_served_weights",),
                DOWNSTREAM_LM,
                "the inference engine serves other weights than the checkpoint under test",
                fix="point the engine at the checkpoint under test",
                rank=90),
    Explanation("weights_load", "weights_not_loaded",
                ("wrapper_prefix", "key_renamed", "missing_keys", "unexpected_keys",
                 "shape_mismatch", "values_altered", "load_error"),
                DOWNSTREAM_POLICY + DOWNSTREAM_LM + ("export_integrity",),
                "part of the model runs on tensors the checkpoint did not provide "
                "(random init)",
                fix="save the state_dict under the model's key names (strip wrapper "
                    "prefixes) and load it strictly",
                only_if=(("export_integrity", not_loaded_explains_provenance),),
                rank=100),
    Explanation("weights_load", "weights_not_loaded",
                ("checkpoint_coverage",),
                ("precision_per_layer",),
                "the model's tensors are not all the checkpoint's, and precision is never "
                "measured on such a model",
                fix="gate a complete save, loaded by the model class it was saved from",
                rank=110),
)

POSITION = 10
"""The check's place in the checklist (and in every report): the registry sorts by it."""
