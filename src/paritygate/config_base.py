"""Shared pieces of the config schema: a strict base model and path helpers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Config section: unknown keys and wrong types are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
