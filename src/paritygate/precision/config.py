"""Config section of the per-layer precision check (``precision:`` in the gate config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from paritygate.config_base import StrictModel

LowDtype = Literal["float16", "bfloat16"]


class PrecisionSpec(StrictModel):
    """How the per-layer fp16/bf16 measurement runs.

    Budgets are in units of the dtype's unit roundoff ``u`` (2^-11 for float16,
    2^-8 for bfloat16), so one number means the same relative care for both
    dtypes; see :mod:`paritygate.precision.budgets` for the formula.
    """

    dtypes: list[LowDtype] = Field(default_factory=lambda: list[LowDtype](["float16", "bfloat16"]))
    budgets: dict[str, float] = Field(default_factory=dict)
    """Per-layer local budget overrides, ``{glob: k}`` meaning budget = k * u.

    The glob matches the layer name (``blocks.3.*``) or ``<dtype>/<layer>``
    (``float16/blocks.3.fc``) to override one dtype only; the last match wins.
    """
    layers: Literal["all", "leaves", "blocks"] = "all"
    """Which modules to measure: every leaf and every block (``all``), or one kind."""
    include: list[str] = Field(default_factory=list)
    """Globs of layer names to measure (empty: every layer)."""
    exclude: list[str] = Field(default_factory=list)
    """Globs of layer names never measured."""
    max_batches: int | None = Field(default=None, ge=1)
    """Use at most this many probe batches (None: all)."""
    local_max_batches: int | None = Field(default=None, ge=1)
    """Measure local error on at most this many batches (None: all); cumulative uses all."""
    onnx_compare: bool = True
    """Compare the ONNX artifact's intermediate tensors when the subject has one."""
    suggest_mixed: bool = True
    """Search and verify a set of layers to keep in fp32 when the output is over budget."""
    max_suggest_runs: int = Field(default=12, ge=1)
    """Verification runs the mixed-precision search may spend (each one full low-precision pass)."""
    streaming: bool | Literal["auto"] = "auto"
    """Read an HF model's layers from its safetensors one at a time (models larger than
    memory; hf_model and causal_lm families). ``auto``: when the model's fp32 size exceeds
    half the available memory."""

    @field_validator("budgets")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for pattern, k in value.items():
            if not k > 0:
                raise ValueError(f"budget for {pattern!r} must be > 0 (units of u), got {k}")
        return value
