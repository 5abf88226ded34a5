"""``behaviour_parity``'s block: ``causal_lm.behaviour``."""

from __future__ import annotations

from pydantic import Field, field_validator

from paritygate.sections import Section

MAX_BEHAVIOUR_SAMPLES = 4096
"""``behaviour.samples`` is at most 4,096 per prompt per side: at that many the tests detect a
length shift of 0.1 standard deviations and a rate change of 0.03 at 90% power (Holm-corrected
at alpha 0.01); more samples only cost generation time."""


class BehaviourSpec(Section):
    """``behaviour_parity``: both sides sampled with their own config on the probes."""

    FAMILY = "causal_lm"
    KEY = "behaviour"
    FIELD_DOC = "``behaviour_parity``'s settings; the check is skipped without them."

    samples: int = Field(64, ge=8, le=MAX_BEHAVIOUR_SAMPLES)
    """Samples per prompt per side; below 8 per prompt the rank tests lack power; at most
    :data:`MAX_BEHAVIOUR_SAMPLES`."""
    alpha: float = Field(0.01, gt=0, lt=1)
    """Family-wise false-alarm rate of the tests (Holm's correction)."""
    format_regex: str | None = None
    """A completion matching this regex (``re.search``) is a format hit."""
    reward_fn: str | None = None
    """``module:callable(prompt: str, completion: str) -> float``: E[reward] compared."""
    reward_tolerance: float = Field(0.05, gt=0)
    """Largest E[reward] difference accepted (the offline equivalence check's roll-back figure)."""
    training_dump: str | list[str] | None = None
    """The training side's samples from rollout dumps (a file, a glob or a list: the shards a
    distributed sampler wrote) instead of HF ``generate``; records need ``prompt_ids``,
    ``completion_ids`` and ``finish_reason``."""
    serving_dump: str | list[str] | None = None
    """The serving side's samples from rollout dumps (as ``training_dump``)."""
    batch_size: int = Field(256, ge=1)
    """Records read and teacher-forced per step: the audit's memory is O(batch_size)."""

    @field_validator("format_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            import re

            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


SECTION = BehaviourSpec
