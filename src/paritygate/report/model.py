"""The report.json contract as pydantic models, and its published JSON Schema.

``schemas/report.schema.json`` and ``schemas/config.schema.json`` in the repository
are generated from :class:`Report` and :class:`paritygate.config.GateConfig` by
:func:`write_schemas` (``python -m paritygate.report.schemagen schemas``); a test
keeps them equal to the committed files.

Non-finite numbers: report.json is strict JSON (no bare ``NaN``/``Infinity``).
Wherever a NaN or an infinity would appear, the report holds the object
``{"value": null, "nonfinite": "nan" | "inf" | "-inf"}`` (:class:`NonFinite`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

SCHEMA_VERSION = "1.0"
"""Bumped on any change a consumer of report.json must adapt to."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NonFinite(_Strict):
    """A NaN or infinity, encoded as strict JSON."""

    value: None = None
    nonfinite: Literal["nan", "inf", "-inf"]


Number = StrictBool | StrictInt | StrictFloat | NonFinite | None


class Counts(_Strict):
    total: int
    passed: int = Field(alias="pass")
    failed: int = Field(alias="fail")
    error: int
    skip: int


class RootCauseRecord(_Strict):
    """The failing check whose finding explains the other failures (see paritygate.rootcause)."""

    check: str
    kind: str = Field(description="finding kind, e.g. weights_not_loaded, stale_artifact")
    message: str
    explains: list[str] = Field(description="checks that fail as a consequence")
    fix: str | None
    finding: str | None = Field(
        None, description="the root check's first finding kind (e.g. missing_reset); null when "
        "it failed by a threshold, regression or NaN only")


class ReasonRecord(_Strict):
    kind: Literal["finding", "breach", "regression", "nonfinite", "no_golden",
                  "probe_set_changed"] = Field(description="the verdict rule that failed")
    message: str
    metric: str | None = Field(description="the metric the rule is about, if any")
    finding: str | None = Field(description="the check's finding kind (kind finding only), "
                                            "e.g. wrapper_prefix, stale_manifest")


class CheckRecord(_Strict):
    id: str
    status: Literal["pass", "fail", "skip", "error"]
    message: str = Field(description="one sentence per failure, or the key metric when passing")
    cause: str | None = Field(description="the first failure sentence; null when passing")
    fix: str | None
    consequence_of: str | None = Field(description="id of the check that explains this failure")
    failed_metrics: list[str] = Field(description="metrics that breached, regressed or are NaN")
    bless_hint: str | None = Field(None, description="how to get the golden baseline the check "
                                   "lacks; null when it has one (never part of fix)")
    metrics: dict[str, Number]
    golden: dict[str, Any] | None
    thresholds: dict[str, Number]
    key_metric: str | None
    reasons: list[ReasonRecord] = Field(description="every rule that failed, in verdict order")
    duration_s: float
    details: dict[str, Any]


class TrainerRecord(_Strict):
    """What the trainer's ``trainer_state.json`` and folder say about the checkpoint."""

    output_dir: str | None = Field(description="the trainer output_dir it was picked from")
    step: int | None = Field(description="global step (trainer_state.json, else checkpoint-N)")
    step_source: str
    epoch: float | None
    trainer_files: list[str] = Field(description="trainer files present, never unpickled")
    checkpoints: list[int] = Field(description="every checkpoint-N step of the output_dir")
    chosen_by: str


class CheckpointRecord(_Strict):
    path: str = Field(description="relative to the config's folder or the repository when "
                                  "inside one, else absolute")
    path_abs: str
    sha256: str
    trainer: TrainerRecord | None = Field(
        None, description="present when the checkpoint is a trainer's checkpoint-N folder")


class Report(_Strict):
    """report.json."""

    schema_version: Literal["1.0"]
    generated_at: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$",
                              description="ISO-8601 UTC time the report was written")
    name: str
    status: Literal["pass", "fail", "nothing_verified"]
    family: Literal["policy", "causal_lm", "hf_model"]
    counts: Counts
    root_cause: RootCauseRecord | None
    bless_hint: str | None = Field(None, description="the run's next step when checks lack a "
                                   "golden baseline (which, and how to bless); null otherwise")
    config: str = Field(description="the config, relative to the repository holding it when "
                                    "inside one, else its file name")
    config_abs: str
    git_commit: str | None = Field(pattern=r"^[0-9a-f]{40,64}$",
                                   description="HEAD of the repository holding the config; "
                                               "null outside a git repository")
    artifact_url: str | None = Field(description="the CI run whose artifacts hold this report")
    checkpoint: CheckpointRecord
    environment: dict[str, str]
    checks: list[CheckRecord]
    not_run: list[str] = Field(default_factory=list,
                               description="selected checks that never ran because the run "
                                           "stopped early (-x, --maxfail); present only then")


def report_schema() -> dict[str, Any]:
    schema = Report.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"paritygate/report.schema.json/{SCHEMA_VERSION}"
    return schema


def config_schema() -> dict[str, Any]:
    from paritygate.config import GateConfig

    schema = GateConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "paritygate/config.schema.json"
    return schema


def _dump_schema() -> dict[str, Any]:
    from paritygate.engines.rollout_dump import DUMP_RECORD_SCHEMA

    return DUMP_RECORD_SCHEMA


def schema_texts() -> dict[str, str]:
    """File name -> text of every published schema."""
    return {
        name: json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in (("report.schema.json", report_schema()),
                             ("config.schema.json", config_schema()),
                             ("rollout_dump.schema.json", _dump_schema()))
    }


def write_schemas(directory: Path) -> list[Path]:
    """Regenerate the published schemas into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in schema_texts().items():
        (directory / name).write_text(text, encoding="utf-8")
        out.append(directory / name)
    return out


def validate_report(data: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``data`` is a valid report.json (strict JSON included).

    Uses the JSON Schema through ``jsonschema`` when installed, and the pydantic
    model in every case.
    """
    text = json.dumps(data, allow_nan=False)  # raises ValueError on bare NaN/Infinity

    def reject(token: str) -> NoReturn:
        raise ValueError(f"non-finite constant {token} in report.json")

    parsed = json.loads(text, parse_constant=reject)
    try:
        import jsonschema
    except ImportError:
        pass
    else:
        try:
            jsonschema.validate(parsed, report_schema())
        except jsonschema.ValidationError as exc:
            path = "/".join(str(p) for p in exc.absolute_path)
            raise ValueError(f"report.json does not match the schema at {path}: "
                             f"{exc.message}") from exc
    Report.model_validate(parsed)
