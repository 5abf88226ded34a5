"""What sampling_config records besides its metrics: the served endpoint and what its defaults
probe sent, the off-policy transforms on each side, and every compared field."""

from __future__ import annotations

from dataclasses import dataclass

from paritygate.records import Record


@dataclass(frozen=True)
class ServerInfo(Record):
    """The OpenAI-compatible server: its model, context and sampling defaults."""

    url: str
    model: str | None
    root: str | None
    max_model_len: int | None
    tokens_needed: int
    sampling: object
    defaults: object


@dataclass(frozen=True)
class ServerRecord(Record):
    server: ServerInfo


@dataclass(frozen=True)
class DefaultsProbe(Record):
    """What the server-defaults probe sent and found."""

    differing: list[str]
    sent: object
    prompts: int
    tokens: int
    inconclusive: str | None
    combined: object


@dataclass(frozen=True)
class DefaultsProbeRecord(Record):
    server_defaults_probe: DefaultsProbe


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
    """Every compared field, each side's file format and how it was detected, and the fields
    one side cannot express."""

    fields: list[FieldRow]
    formats: dict[str, str]
    format_detection: dict[str, str]
    not_compared: object
