"""sampling_config: the trainer's sampler and the server use one sampling protocol.

Field-by-field diff of the training sampling YAML and the serving config (HF
``generation_config.json`` or vLLM sampling-parameters YAML), each read with its
format's defaults for absent fields. A difference fails unless the allow-list
(``causal_lm.sampling.allow``) names the field with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paritygate.check import CheckSpec
from paritygate.result import Measurement

# Any unexplained difference changes the sampled distribution or the response length,
# so the importance ratio no longer describes the rollouts: zero tolerance.
DEFAULTS: dict[str, float] = {"fields_differing": 0.0}


@dataclass(frozen=True)
class FieldDiff:
    field: str
    training: Any
    serving: Any
    allowed_reason: str | None


def diff_sampling(
    training: Any, serving: Any, allow: dict[str, str]
) -> list[FieldDiff]:
    """Fields whose values differ; ``use_cache`` only when both sides state it."""
    diffs: list[FieldDiff] = []
    for name in training.compared_fields:
        t, s = training.values.get(name), serving.values.get(name)
        if t is None or s is None:
            continue
        if t != s:
            diffs.append(FieldDiff(name, t, s, allow.get(name)))
    return diffs


def measure(ctx: Any, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("sampling_config")
    training, serving = ctx.training_sampling, ctx.serving_sampling
    compared = training.compared_fields
    allow = {entry.field: entry.reason for entry in ctx.spec.sampling.allow}
    for name in allow:
        if name not in compared:
            m.fail(f"allow-list names unknown sampling field {name!r}")
    diffs = diff_sampling(training, serving, allow)
    unexplained = [d for d in diffs if d.allowed_reason is None]
    for d in unexplained:
        m.fail(
            f"{d.field} differs: training {d.training!r} vs serving {d.serving!r} "
            f"({training.path.name} vs {serving.path.name})"
        )
    for d in diffs:
        if d.allowed_reason is not None:
            m.note(f"{d.field} differs (allowed: {d.allowed_reason})")
    for name in allow:
        if name in compared and not any(d.field == name for d in diffs):
            m.note(f"allow-list entry {name!r} is unused: the field agrees")
    m.metric(
        "fields_differing", len(unexplained), threshold=thresholds["fields_differing"], key=True
    )
    m.metric("fields_allowed", len(diffs) - len(unexplained), bad="none")
    m.metric("fields_compared", len(compared), bad="none", ratchet=False)
    m.details["fields"] = [
        {
            "field": name,
            "training": training.values.get(name),
            "serving": serving.values.get(name),
            "training_explicit": name in training.explicit,
            "serving_explicit": name in serving.explicit,
            "allowed": allow.get(name),
        }
        for name in compared
    ]
    m.details["formats"] = {"training": training.format, "serving": serving.format}
    return m


CHECK = CheckSpec(
    id="sampling_config",
    summary="training sampler and serving use one sampling protocol",
    families=("causal_lm",),
    measure=measure,
    defaults=DEFAULTS,
    marks=("fast",),
)
