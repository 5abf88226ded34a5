"""What logprob_delta and vllm_delta record besides their metrics: the tier and the delta's
statistics, each token's delta (the report's plots), the engine, and the fits that name a
cause (a penalty's signature, a temperature ratio)."""

from __future__ import annotations

from dataclasses import dataclass

from paritygate.records import Record


@dataclass(frozen=True)
class DeltaRecord(Record):
    """The precision tier judged against, and the delta's statistics (:class:`DeltaStats`)."""

    tier: dict[str, object]
    delta: dict[str, object]


@dataclass(frozen=True)
class TokenDelta(Record):
    """One generated token's ``logp_train - logp_infer`` (the report's plots)."""

    seq: int
    pos: int
    delta: float


@dataclass(frozen=True)
class PerToken(Record):
    per_token: list[TokenDelta]


@dataclass(frozen=True)
class EngineInfo(Record):
    """The engine whose log-probs were compared, the kind it returns and its dtype."""

    name: str
    logprobs_mode: str
    dtype: str


@dataclass(frozen=True)
class EngineRecord(Record):
    engine: EngineInfo


@dataclass(frozen=True)
class PenaltyRecord(Record):
    """The penalty fitted to the delta: kind, strength, the trainer's declared base, the share
    of the squared delta it explains, rms before and after, where the penalty reads tokens."""

    penalty_fit: dict[str, float | str | int]


@dataclass(frozen=True)
class TemperatureFit(Record):
    """The temperature ratio that best explains the delta, and how much of it it explains."""

    ratio: float
    explained: float


@dataclass(frozen=True)
class TemperatureRecord(Record):
    temperature_fit: TemperatureFit
