"""sampling_config: the trainer's sampler and the server use one sampling protocol.

Field-by-field diff of the training sampling YAML and the serving config (HF
``generation_config.json`` or vLLM sampling-parameters YAML), each read with its
format's defaults for absent fields. A difference fails unless the allow-list
(``causal_lm.sampling.allow``) names the field with a reason. With ``engines: [endpoint]``,
the server's ``max_model_len`` and its sampling defaults (where it exposes them) are
compared with the serving config too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.causes import Explanation
from paritygate.check import CheckSpec
from paritygate.checks._served_endpoint import record_server
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.causal_lm.sampling import SamplingFile

KIND = "serving_file_contradicts_served_dir"
"""A declared serving file differs from the served directory's own
(:mod:`paritygate.families.causal_lm.served_files`); ``sampling_config`` and
``tokenizer_parity`` record it for the inputs each reads."""

ALLOW_FIELD = "served_dir"
"""The allow-list field (``sampling.allow``, ``tokenizer.allow``) that accepts a declared
serving file the served engine really reads instead of the served directory's own (vLLM
``--generation-config``, ``--tokenizer``, ``--chat-template``), with its reason."""

# Any unexplained difference changes the sampled distribution or the response length,
# so the importance ratio no longer describes the rollouts: zero tolerance.
DEFAULTS: dict[str, float] = {"fields_differing": 0.0}


@dataclass(frozen=True)
class OffPolicy(Record):
    """Per side, the fields that move its sampled distribution away from the policy's."""

    off_policy: dict[str, dict[str, object]]


@dataclass(frozen=True)
class FieldRow(Record):
    """One compared sampling field: each side's value, whether it was written, and the
    allow-list's reason when a difference is accepted."""

    field: str
    training: object
    serving: object
    training_explicit: bool
    serving_explicit: bool
    allowed: str | None


@dataclass(frozen=True)
class FieldsRecord(Record):
    """What the check records besides its metrics: every compared field, each side's file
    format and how it was detected, and the fields one side cannot express."""

    fields: list[FieldRow]
    formats: dict[str, str]
    format_detection: dict[str, str]
    not_compared: object


@dataclass(frozen=True)
class FieldDiff:
    field: str
    training: object
    serving: object
    allowed_reason: str | None


def effective_stops(side: SamplingFile) -> tuple[list[str], list[int]]:
    """Stop strings and stop token ids without the side's EOS ids, which stop generation
    anyway (unless ``ignore_eos``): a stop string equal to the EOS token is the same stop."""
    stop, ids = list(side.values.get("stop") or []), list(side.values.get("stop_token_ids") or [])
    if side.values.get("ignore_eos"):
        return stop, ids
    eos_ids = set(side.values.get("eos_token_id") or [])
    eos_text = side.eos_text if side.eos_id in eos_ids else None
    return (
        [x for x in stop if eos_text is None or x != eos_text],
        [x for x in ids if x not in eos_ids],
    )


def diff_sampling(
    training: SamplingFile, serving: SamplingFile, allow: dict[str, str],
    skip: frozenset[str] = frozenset(),
) -> list[FieldDiff]:
    """Fields whose values differ, but those in ``skip``; ``use_cache`` only when both sides
    state it; stop strings and stop token ids compared without EOS (see
    :func:`effective_stops`); EOS ids not when both sides ignore EOS."""
    diffs: list[FieldDiff] = []
    t_stops, s_stops = effective_stops(training), effective_stops(serving)
    both_ignore_eos = bool(training.values.get("ignore_eos") and serving.values.get("ignore_eos"))
    for name in training.compared_fields:
        if name in skip:
            continue
        t, s = training.values.get(name), serving.values.get(name)
        if name == "stop":
            t, s = t_stops[0], s_stops[0]
        elif name == "stop_token_ids":
            t, s = t_stops[1], s_stops[1]
        elif name == "eos_token_id" and both_ignore_eos:
            continue
        if t is None or s is None:
            continue
        if t != s:
            diffs.append(FieldDiff(name, t, s, allow.get(name)))
    return diffs


def declared_dtype_reason(spec: CausalLMSpec, key: str, dtype: str) -> str:
    """Why a serving dtype that the config states is not a sampling difference: it is a
    deliberate precision change, and its precision tier judges the numbers."""
    from paritygate.metrics.tiers import tier_for

    tier = spec.precision_tier
    if not tier:
        try:
            tier = tier_for(spec.training.dtype, dtype)[0]
        except ValueError:
            return f"declared by {key}; set causal_lm.precision_tier to judge its numbers"
    return (f"declared by {key}; the {tier} precision tier judges logits_agreement, logprob_delta "
            "and generation_parity")


def engine_diffs(ctx: LMContext, allow: dict[str, str], skip: frozenset[str]
                 ) -> list[tuple[FieldDiff, str, SamplingFile]]:
    """Each difference between the training config and the serving config as a serving
    engine applies it (:mod:`~paritygate.families.causal_lm.engine_sampling`: vLLM reads a
    generation_config.json otherwise than HF), once, with the engines it holds for ('' when
    every configured engine) and the serving side it was read from."""
    engines = list(dict.fromkeys(ctx.spec.engines)) or ["hf"]
    found: dict[tuple[str, str, str], tuple[FieldDiff, list[str], SamplingFile]] = {}
    for engine in engines:
        side = ctx.engines.applied(engine)
        for d in diff_sampling(ctx.training.sampling, side, allow, skip):
            key = (d.field, repr(d.training), repr(d.serving))
            found.setdefault(key, (d, [], side))[1].append(engine)
    return [(d, "" if len(names) == len(engines) else ", ".join(names), side)
            for d, names, side in found.values()]


PADDING_FIELDS = frozenset({"padding_side", "truncation_side"})
"""Fields that matter only where the serving engine pads or truncates a batch (HF generate)."""


def unpadded_fields(ctx: LMContext) -> frozenset[str]:
    """:data:`PADDING_FIELDS` the serving side defaults from its tokenizer (its sampling file
    does not state them) when every serving engine runs each prompt unpadded (``vllm``,
    ``endpoint``): a tokenizer's ``padding_side`` there is no part of the protocol."""
    if not ctx.spec.engines or not set(ctx.spec.engines) <= {"vllm", "endpoint"}:
        return frozenset()
    return PADDING_FIELDS - set(ctx.serving.sampling.explicit)


def record_contradictions(
    m: Measurement, ctx: LMContext, part: str, allow: Mapping[str, str]
) -> None:
    """Fail (or, allowed with ``served_dir``, note) each declared serving ``part`` file that
    contradicts the served directory's own (see :attr:`LMContext.contradictions`).
    """
    for found in ctx.contradictions:
        if found.part != part:
            continue
        if ALLOW_FIELD in allow:
            m.note(f"{found.message()} (allowed: {allow[ALLOW_FIELD]})")
        else:
            m.fail(KIND, found.message())


def _off_policy(
    m: Measurement, training: SamplingFile, serving: SamplingFile, applied: set[str]
) -> None:
    """Fail ``off_policy_transform`` for each field that moves a side's sampled distribution
    away from the policy's softmax (a penalty, a bias, banned tokens, a minimum length), even
    when both sides agree: the trainer's log-probs score the plain policy, so the ratio of a
    sample drawn under the transform is off-policy. A field the trainer's log-prob function
    applies too (``causal_lm.training.logprob_applies``) is noted instead."""
    sides = {"serving": serving.off_policy(), "training": training.off_policy()}
    for name in dict.fromkeys([*sides["serving"], *sides["training"]]):
        where = ", ".join(f"{label} {found[name]!r}" for label, found in sides.items()
                          if name in found)
        if name in applied:
            m.note(f"{name} ({where}) moves the sampled distribution; the trainer's log-prob "
                   "function applies it too (causal_lm.training.logprob_applies)")
            continue
        m.fail("off_policy_transform",
               f"{name} ({where}) moves the sampled distribution away from the policy: the "
               "trainer's log-probs score the plain softmax, so samples drawn under it are "
               "off-policy even where both sides agree (remove it, or declare "
               f"causal_lm.training.logprob_applies: [{name}] if the trainer's log-prob "
               "function applies the same transform)")
    m.record(OffPolicy({label: {k: _jsonable(v) for k, v in found.items()}
                        for label, found in sides.items()}))


def _note_vllm_reading(m: Measurement, ctx: LMContext) -> None:
    """Say which fields of a served generation_config.json an engine does not take from it
    (vLLM: :mod:`~paritygate.families.causal_lm.engine_sampling`)."""
    for engine in dict.fromkeys(ctx.spec.engines):
        side = ctx.engines.applied(engine)
        if side is ctx.serving.sampling:
            continue
        ignored = sorted(n for n, src in side.default_sources.items() if src.startswith("vLLM"))
        m.note(f"{side.path.name} compared as engine {engine} applies it: {', '.join(ignored)} "
               "take vLLM's defaults (vLLM takes only the sampling fields the file states of "
               "temperature, top_k, top_p, min_p, the penalties and max_new_tokens)")


def _jsonable(value: object) -> object:
    return value if isinstance(value, (int, float, str, bool, list)) or value is None else (
        {str(k): v for k, v in value.items()} if isinstance(value, dict) else str(value))


def measure(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("sampling_config")
    training, serving = ctx.training.sampling, ctx.serving.sampling
    compared = training.compared_fields
    allow = {entry.field: entry.reason for entry in ctx.spec.sampling.allow}
    declared = ctx.declared_dtype
    if (
        declared
        and "dtype" not in allow
        and "dtype" not in serving.explicit
        and training.values.get("dtype") != serving.values.get("dtype")
    ):
        allow["dtype"] = declared_dtype_reason(ctx.spec, *declared)
    for name in allow:
        if name not in compared and name != ALLOW_FIELD:
            m.fail("unknown_allow_field", f"allow-list names unknown sampling field {name!r}")
    for label, side in (("training", training), ("serving", serving)):
        contradiction = side.contradiction()
        if contradiction:
            m.fail("wrong_format", f"{label} sampling config in the wrong format: {contradiction}")
        m.note(f"{label} sampling config {side.path.name}: {side.format} ({side.detection})")
    not_compared = {
        name: {
            "training": training.not_compared.get(name),
            "serving": serving.not_compared.get(name),
        }
        for name in sorted(set(training.not_compared) | set(serving.not_compared))
    }
    if not_compared:
        m.note(
            "not compared: "
            + ", ".join(f"{k} ({training.not_compared_reason(k)})" for k in not_compared)
        )
    unpadded = unpadded_fields(ctx)
    if unpadded:
        m.note(f"not compared: {', '.join(sorted(unpadded))} (the serving engines, "
               f"{', '.join(ctx.spec.engines)}, send every prompt alone: no batch is padded or "
               "truncated, and the serving sampling config does not state them)")
    found = engine_diffs(ctx, allow, unpadded)
    diffs = [d for d, _, _ in found]
    unexplained = [d for d in diffs if d.allowed_reason is None]
    for d, engines, side in found:
        if d.allowed_reason is None:
            m.fail("field_differs",
                   f"{d.field} differs: training {d.training!r} vs serving {d.serving!r} "
                   f"({training.source(d.field)} vs {side.source(d.field)})"
                   + (f" under engine {engines}" if engines else ""))
    _off_policy(m, training, serving, set(ctx.spec.training.logprob_applies))
    _note_vllm_reading(m, ctx)
    for d in diffs:
        if d.allowed_reason is not None:
            m.note(f"{d.field} differs (allowed: {d.allowed_reason})")
    for name in allow:
        if name in compared and not any(d.field == name for d in diffs):
            m.note(f"allow-list entry {name!r} is unused: the field agrees")
    record_contradictions(m, ctx, "sampling config", allow)
    if "endpoint" in ctx.spec.engines:
        record_server(m, ctx.engines["endpoint"], ctx.serving)
    own = ctx.served_config_dtype
    if declared and own and own != declared[1] and not declared[0].endswith("config.json dtype"):
        m.note(f"serving dtype {declared[1]} ({declared[0]}) overrides the served directory's "
               f"config.json dtype {own}, as an engine's dtype option does")
    m.metric(
        "fields_differing", len(unexplained), threshold=thresholds["fields_differing"], key=True
    )
    m.metric("fields_allowed", len(diffs) - len(unexplained), bad="none")
    m.metric("fields_compared", len(compared), bad="none", ratchet=False)
    m.record(FieldsRecord(
        [FieldRow(name, training.values.get(name), serving.values.get(name),
                  name in training.explicit, name in serving.explicit, allow.get(name))
         for name in compared],
        {"training": training.format, "serving": serving.format},
        {"training": training.detection, "serving": serving.detection}, not_compared))
    return m


CHECK = CheckSpec(
    id="sampling_config",
    summary="training sampler and serving use one sampling protocol",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    needs=(),
    kinds=("unknown_allow_field", "wrong_format", "field_differs", "off_policy_transform",
           KIND, "server_max_model_len", "server_default_differs"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("sampling_config", "serving_file_contradicts_served_dir",
                ("serving_file_contradicts_served_dir",),
                ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement"),
                "a serving file the config declares is not the one the served directory "
                "ships, so the gate judged a serving setup that does not ship",
                fix="remove the declared serving path (the served directory's own file is "
                    "the default), or ship the declared file",
                rank=300),
    Explanation("sampling_config", "server_context", ("server_max_model_len",),
                ("logprob_delta", "generation_parity", "behaviour_parity", "batch_invariance"),
                "the server's context (max_model_len) is under the longest probe plus "
                "max_new_tokens, so it cuts completions the trainer samples in full",
                fix="start the server with --max-model-len of at least the longest prompt "
                    "plus max_new_tokens (or serve shorter prompts: max_prompt_tokens)",
                rank=305),
    Explanation("sampling_config", "server_defaults", ("server_default_differs",),
                ("logprob_delta", "generation_parity", "behaviour_parity"),
                "the server samples a request that leaves a field out with its own default, "
                "not the serving config's value",
                fix="start the server without --override-generation-config and with the "
                    "served directory's generation config (vLLM: --generation-config auto), or "
                    "make every client send the field (causal_lm.endpoint.sampling: request)",
                rank=323),
    Explanation("sampling_config", "off_policy_transform", ("off_policy_transform",),
                ("logprob_delta", "vllm_delta", "behaviour_parity", "generation_parity",
                 "logits_agreement"),
                "the served distribution is the policy's moved by a penalty, bias, banned "
                "tokens or a minimum length, which the trainer's log-probs do not apply",
                fix="remove the field from both sampling configs (sample from the policy's "
                    "own distribution), or make causal_lm.training.logprob_fn apply the same "
                    "transform and declare it: causal_lm.training.logprob_applies: [FIELD]",
                rank=322),
    Explanation("sampling_config", "sampling_protocol", None,
                ("logprob_delta", "vllm_delta", "generation_parity", "logits_agreement",
                 "behaviour_parity"),
                "training and serving sample under different settings",
                fix="make the serving sampling config's differing fields equal the training "
                    "ones (the served directory's generation_config.json is the serving "
                    "default), or accept one with a reason: causal_lm.sampling.allow: "
                    "[{field, reason}]",
                rank=330),
)

POSITION = 70
"""The check's place in the checklist (and in every report): the registry sorts by it."""
