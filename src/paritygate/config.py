"""Gate config: YAML, validated at load, every error naming the file and the key.

One file describes one gate: which model family, where the checkpoint, artifact
and probes are, which checks run, their thresholds and the golden directory.
Relative paths resolve against the folder of the config file.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from paritygate.config_base import ConfigPath, StrictModel
from paritygate.errors import InputError, dotted_leaves, shorten
from paritygate.families.causal_lm.config import CausalLMSpec
from paritygate.families.hf_model.config import HFModelSpec
from paritygate.families.policy.config import PolicySpec
from paritygate.precision.config import PrecisionSpec
from paritygate.trainer_output import CHECKPOINT_ENV, TrainerCheckpoint, pick_checkpoint

ReportFormat = Literal["json", "md", "html", "junit"]
REPORT_FORMATS: tuple[ReportFormat, ...] = ("json", "md", "html", "junit")
"""Report files by format name: report.json, report.md, report.html, junit.xml."""
DEFAULT_REPORT_FORMATS: tuple[ReportFormat, ...] = ("json", "md", "junit")
"""Written unless a config or run asks otherwise: everything but the HTML page (whose figures
cost matplotlib's import and drawing on every run)."""


def parse_report_formats(text: str) -> tuple[str, ...]:
    """``--report-format md,html``: the named formats; an unknown one is bad input."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if name not in REPORT_FORMATS:
            raise InputError(None, "--report-format", f"unknown report format {name!r}; "
                             f"choose from {', '.join(REPORT_FORMATS)}")
    return names


class GoldenSettings(StrictModel):
    """Where baselines live and how much worse than golden a metric may get."""

    dir: ConfigPath = Field(Path("golden"), validate_default=True)
    """Relative to the config file; baselines live in ``<dir>/<baseline>/<check_id>.json``."""
    baseline: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Baseline name (default: the config's ``name``): many candidate configs can gate against
    one blessed baseline."""
    rel_margin: float = Field(0.25, ge=0)
    """A metric may be this fraction worse than golden (new checkpoints legitimately move)."""
    threshold_fraction: float = Field(0.05, ge=0)
    """... plus this fraction of its absolute threshold, so near-zero baselines are not brittle."""


class GateConfig(StrictModel):
    """The whole gate config."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    family: Literal["policy", "causal_lm", "hf_model"]
    checks: list[str] | None = None
    skip_checks: list[str] = []
    thresholds: dict[str, dict[str, float | None]] = {}
    """Per check and metric; ``null`` makes the metric informational (reported, never judged)."""
    golden: GoldenSettings = GoldenSettings()
    report_dir: ConfigPath | None = None
    report_formats: list[ReportFormat] = list(DEFAULT_REPORT_FORMATS)
    """Report files to write: report.json always (the contract), report.md, junit.xml and
    report.html on request. Figures (PNG, matplotlib) are drawn only for report.html, so a
    run without it never imports matplotlib. ``paritygate run --report-format`` overrides."""
    seed: int = 0
    threads: int | None = Field(default=None, ge=1)
    """Intra-op threads for torch and ONNX Runtime (default: the cores the process is given,
    shared among pytest-xdist workers; ``PARITYGATE_THREADS`` sets it too). See
    :mod:`paritygate.threads`."""
    allow_pickle: bool = False
    """Allow checkpoint formats that unpickle arbitrary objects (runs code from the file)."""
    trust_remote_code: bool = False
    python_path: list[ConfigPath] = []
    """Folders (relative to the config file) where ``module:callable`` names are imported from,
    searched before ``sys.path``."""
    policy: PolicySpec | None = None
    causal_lm: CausalLMSpec | None = None
    hf_model: HFModelSpec | None = None
    precision: PrecisionSpec = PrecisionSpec()

    _path: Path = PrivateAttr(default=Path("gate.yaml"))
    _report_dir: Path | None = PrivateAttr(default=None)
    _report_formats: tuple[str, ...] | None = PrivateAttr(default=None)
    _trainer_checkpoint: TrainerCheckpoint | None = PrivateAttr(default=None)

    @field_validator("checks", "skip_checks")
    @classmethod
    def _known_checks(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """Every id is a check, and one this family's gate runs (as ``--check`` requires)."""
        from paritygate.checks import CHECK_IDS, checks_for

        family = info.data.get("family")
        runs = [c.id for c in checks_for(family)] if family else list(CHECK_IDS)
        for cid in value or []:
            if cid not in CHECK_IDS:
                raise ValueError(f"unknown check id {cid!r}; known: {', '.join(CHECK_IDS)}")
            if cid not in runs:
                raise ValueError(
                    f"{cid} is not a check this {family} gate runs; its checks: {', '.join(runs)}"
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _golden_defaults(cls, data: object) -> object:
        """An omitted ``golden:`` section is validated as an empty one, so its default folder
        is resolved against the config file's like a written one."""
        if isinstance(data, dict) and "golden" not in data:
            return {**data, "golden": {}}
        return data

    @model_validator(mode="after")
    def _family_section(self) -> GateConfig:
        section = {"policy": self.policy, "causal_lm": self.causal_lm, "hf_model": self.hf_model}[
            self.family
        ]
        if section is None:
            raise ValueError(f"family {self.family!r} needs a '{self.family}' section")
        return self

    @property
    def path(self) -> Path:
        return self._path

    @property
    def trainer_checkpoint(self) -> TrainerCheckpoint | None:
        """The trainer checkpoint the model directory resolved to
        (:class:`paritygate.trainer_output.TrainerCheckpoint`), or ``None``."""
        return self._trainer_checkpoint

    @property
    def base_dir(self) -> Path:
        return self._path.parent

    def resolve(self, value: str | Path) -> Path:
        """A path relative to the config file's folder. The config's path keys are resolved
        when it loads (:data:`~paritygate.config_base.ConfigPath`); this serves values that
        are paths only by name (``factory_path_kwargs``) and keys not yet typed as paths."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def named_paths(self) -> dict[str, Path]:
        """Every string value of the config (dotted key -> the path it names, resolved), so
        an error about a file can name the key that points at it
        (:func:`paritygate.errors.name_config_key`). Values that are not paths (names,
        ``module:callable``) resolve to paths no error is about and match nothing."""
        named: dict[str, Path] = {}
        for key, value in dotted_leaves(self.model_dump(exclude_none=True)):
            if isinstance(value, Path):
                named[key] = value
            elif isinstance(value, str) and value and key not in ("name", "family"):
                named[key] = self.resolve(value)
        return named

    def key_error(self, error: InputError) -> InputError:
        """``error`` naming the config key of the file it is about (see :meth:`named_paths`)."""
        from paritygate.errors import name_config_key

        return name_config_key(error, self.named_paths(), self.path)

    def golden_dir(self) -> Path:
        return self.golden.dir / (self.golden.baseline or self.name)

    def set_report_dir(self, path: str | Path) -> None:
        """The run's ``--report-dir`` (overrides the config's ``report_dir``)."""
        self._report_dir = Path(path).expanduser().resolve()

    def set_report_formats(self, text: str) -> None:
        """The run's ``--report-format LIST`` (overrides the config's ``report_formats``); an
        unknown format is bad input."""
        self._report_formats = parse_report_formats(text)

    def formats(self) -> frozenset[str]:
        """The report files this run writes (``json`` always among them)."""
        chosen = self._report_formats if self._report_formats is not None else self.report_formats
        return frozenset({"json", *chosen})

    def default_report_dir(self) -> Path:
        if self._report_dir is not None:
            return self._report_dir
        if self.report_dir:
            return self.report_dir
        return Path.cwd() / "reports" / self.name


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


MAX_ECHO_CHARS = 200
"""At most this much of a wrong value is echoed in an error line."""


def _echo(value: object) -> str:
    """``repr(value)``, cut: a hostile value must not become a megabyte error line."""
    return shorten(_short_repr(value), MAX_ECHO_CHARS)


def _short_repr(value: object) -> str:
    """A repr that stops early on deep or long containers (``reprlib``), plain otherwise."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxtuple, short.maxset = 3, 8, 8, 8, 8
    short.maxstring = short.maxother = MAX_ECHO_CHARS
    return short.repr(value) if isinstance(value, (dict, list, tuple, set, str)) else repr(value)


def _describe_error(err: ErrorDetails) -> tuple[str | None, str]:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if loc and loc[-1] in ("float", "none") and len(loc) >= 3 and loc[0] == "thresholds":
        loc = loc[:-1]  # the union branch (float | None) is not a key
    kind = err["type"]
    if kind == "extra_forbidden":
        cause = "unknown key"
    elif kind == "missing":
        cause = "required key is missing"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        cause = f"{msg} (got {_echo(err.get('input'))})" if kind != "value_error" else msg
    return _format_loc(loc) or None, cause


def config_from_dict(data: object, path: Path) -> GateConfig:
    """Validate a parsed config; raises :class:`InputError` naming the first bad key."""
    if not isinstance(data, dict):
        raise InputError(path, None, "config must be a YAML mapping")
    try:
        config = GateConfig.model_validate(data, context={"base_dir": Path(path).resolve().parent})
    except ValidationError as exc:
        problems = [_describe_error(err) for err in exc.errors()]
        key, cause = problems[0]
        # Every problem at once, still on one line: the first names the key, the rest follow.
        rest = [f"{k}: {c}" if k else c for k, c in problems[1:]]
        raise InputError(path, key, "; ".join([cause, *rest])) from None
    config._path = Path(path).resolve()
    _validate_thresholds(config, path)
    config = apply_checkpoint(config, os.environ.get(CHECKPOINT_ENV))
    _refuse_special_files(config)
    from paritygate.imports import register_python_path

    register_python_path(config.path, list(config.python_path))
    return config


def apply_checkpoint(config: GateConfig, override: str | None = None) -> GateConfig:
    """``config`` with its model directory resolved to one checkpoint
    (:func:`paritygate.trainer_output.pick_checkpoint` says how ``override`` picks it). The
    trainer's record is kept on the config (:attr:`GateConfig.trainer_checkpoint`) for the
    report and the provenance."""
    section_name, field = ("policy", "checkpoint") if config.family == "policy" \
        else (config.family, "model_dir")
    section = getattr(config, section_name)
    by_folder = field == "model_dir"
    selector = getattr(section, "checkpoint", None) if by_folder else None
    new_value, record = pick_checkpoint(
        str(getattr(section, field)), override=override, base=config.resolve, where=config.path,
        key=f"{section_name}.{'checkpoint' if selector is not None else field}",
        selector=selector, earlier=config.trainer_checkpoint, accepts_output_dir=by_folder)
    if new_value is None:
        return config
    updated = config.model_copy(
        update={section_name: section.model_copy(update={field: config.resolve(new_value)})}
    )
    updated._trainer_checkpoint = record
    return updated


def _refuse_special_files(config: GateConfig) -> None:
    """No path the config names is a FIFO, device or socket (links followed): refused at load,
    naming the key, before any reader could block on one. Each reader checks its file again
    (:func:`paritygate.reading.check_input`) with its own size bounds."""
    from paritygate.reading import check_input

    for key, target in config.named_paths().items():
        check_input(target, key, what="input", expect="any")


def _validate_thresholds(config: GateConfig, path: Path) -> None:
    from paritygate.checks import CHECK_IDS, get_check

    for cid, values in config.thresholds.items():
        if cid not in CHECK_IDS:
            raise InputError(
                path, f"thresholds.{cid}", f"unknown check id; known: {', '.join(CHECK_IDS)}"
            )
        known = get_check(cid).defaults
        for metric, value in values.items():
            if metric not in known:
                choices = ", ".join(sorted(known)) or "none"
                raise InputError(
                    path, f"thresholds.{cid}.{metric}", f"unknown threshold; known: {choices}"
                )
            if value is not None and not math.isfinite(value):
                raise InputError(
                    path,
                    f"thresholds.{cid}.{metric}",
                    f"threshold must be a finite number, or null to make the metric "
                    f"informational (got {value})",
                )


def load_config(path: str | Path) -> GateConfig:
    """Read and validate a gate config file."""
    from paritygate.reading import MAX_CONFIG_BYTES, read_text
    from paritygate.reading_text import parse_yaml

    p = Path(path)
    if p.is_dir():
        raise InputError(p, None, "config is a directory, expected a YAML file")
    text = read_text(p, None, what="config file", max_bytes=MAX_CONFIG_BYTES,
                     bound="MAX_CONFIG_BYTES")
    data = parse_yaml(text, p)
    _refuse_todos(data, p)
    return config_from_dict(data, p)


def _refuse_todos(data: object, path: Path) -> None:
    """A config from ``paritygate init`` runs only once every ``TODO`` value is filled in."""
    from paritygate.init_infer import find_todos

    todos = find_todos(data)
    if todos:
        more = f" (and {len(todos) - 1} more: {', '.join(todos[1:])})" if len(todos) > 1 else ""
        raise InputError(path, todos[0], f"still TODO: replace the placeholder{more}")
