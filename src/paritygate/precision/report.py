"""The judged precision report: a report with per-dtype summaries and per-layer rows.

Code reads it by attribute. Its parts are :class:`paritygate.records.Record` dataclasses
(mutable: the analysis fills them in) whose JSON form (precision.json and the check's details)
keeps the fields in declaration order and non-finite numbers as the strings
``"nan"``/``"inf"``/``"-inf"``; :meth:`~paritygate.records.Record.read` reads it back unchanged
(a report that crossed a process boundary as JSON renders the same files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from paritygate import records
from paritygate.records import OMIT_EMPTY


class ReportPart(records.Record):
    """A precision report's part: NaN/Inf written as strings, as precision.json needs."""

    NONFINITE_AS_TEXT: ClassVar[bool] = True


@dataclass
class LayerRow(ReportPart):
    """One layer in one dtype: its local and cumulative error against fp32, and its verdict."""

    dtype: str
    index: int
    layer: str
    type: str
    kind: str
    budget_ulps: float
    budget: float
    local_rel_l2: float
    local_max_abs: float
    local_p99_abs: float
    local_cosine: float
    local_sqnr_db: float
    local_nan: int
    local_inf: int
    cum_rel_l2: float
    cum_max_abs: float
    cum_p99_abs: float
    cum_cosine: float
    cum_sqnr_db: float
    cum_nan: int
    cum_inf: int
    cum_in_rel_l2: float
    amplification: float | None
    headroom: float
    underflow_fraction: float
    numel: int
    over_budget: bool
    local_error: str | None
    """Why the layer's rerun alone failed (it is then not judged on local error)."""
    input_beyond_range: bool
    """Its fp32 input exceeded the dtype's range: its local error is inherited clipping."""
    weights_beyond_range: dict[str, int] = field(default_factory=dict, metadata=OMIT_EMPTY)
    """Its parameters whose values a cast turns into Inf, by name and count."""


@dataclass
class FirstDivergent(ReportPart):
    """The first layer (execution order) over its local budget in one dtype, and why."""

    layer: str
    index: int
    type: str
    local_rel_l2: float
    budget: float
    reason: str


@dataclass
class MixedFix(ReportPart):
    """The smallest verified set of layers kept in fp32 that brings the output in budget."""

    keep_fp32: list[str]
    verified: bool
    output_rel_l2: float | None
    share: float
    """The largest share of the measured leaf layers one kept layer holds."""
    large: bool
    runs: int
    tried: list[dict[str, object]]
    """Every verification run: ``keep_fp32`` and ``output_rel_l2``/``nonfinite`` or ``error``."""


@dataclass
class DtypeSummary(ReportPart):
    """The judged outcome of one dtype."""

    error: str | None
    """Why the whole model does not run in this dtype (it is then skipped)."""
    output_rel_l2: float
    output_max_abs: float
    output_cosine: float
    output_nan: int
    output_inf: int
    output_budget: float
    output_over_budget: bool
    layers_over_budget: int
    first_divergent: FirstDivergent | None
    local_unmeasured: list[str]
    input_beyond_range: list[str]
    max_headroom: float
    max_headroom_layer: str | None
    mixed: MixedFix | None = None


@dataclass
class OnnxRow(ReportPart):
    """One layer's ONNX artifact tensor against torch fp32."""

    index: int
    layer: str
    type: str
    onnx_value: str
    onnx_rel_l2: float
    onnx_max_abs: float
    onnx_p99_abs: float
    onnx_cosine: float
    onnx_sqnr_db: float
    onnx_nan: int
    onnx_inf: int
    budget: float
    over_budget: bool


@dataclass
class OnnxUnmapped(ReportPart):
    layer: str
    reason: str


@dataclass
class OnnxFirstDivergent(ReportPart):
    layer: str
    index: int
    rel_l2: float
    budget: float


@dataclass
class OnnxReport(ReportPart):
    """The ONNX artifact compared per layer and at its output with torch fp32."""

    path: str
    dtype: str
    unit_roundoff: float
    output_name: str
    rows: list[OnnxRow]
    unmapped: list[OnnxUnmapped]
    unscoped_nodes: int
    missing_feeds: int
    output_error: str | None
    first_divergent: OnnxFirstDivergent | None
    output_rel_l2: float
    output_max_abs: float
    output_nan: int
    output_inf: int
    output_budget: float
    output_over_budget: bool
    marked_output_rel_l2: float
    marked_output_row: str | None
    marking_note: str | None


@dataclass
class PrecisionReport(ReportPart):
    """Rows per (dtype, layer), a judged summary per dtype, the ONNX comparison if one ran."""

    dtypes: list[str]
    depth: int
    k_local: float
    k_out: float
    budget_formula: str
    rows: list[LayerRow]
    summary: dict[str, DtypeSummary]
    reference_output_nonfinite: int
    notes: list[str]
    onnx: OnnxReport | None = None
    headroom_max: float | None = field(default=None, metadata=OMIT_EMPTY)
    """The headroom threshold the check judged with (its plot marks it)."""

    def dtype_rows(self, dtype: str) -> list[LayerRow]:
        return [r for r in self.rows if r.dtype == dtype]


@dataclass(frozen=True)
class PrecisionDetails(records.Record):
    """precision_per_layer's record: its report, read back by the renderer."""

    precision: PrecisionReport
