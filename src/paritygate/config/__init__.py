"""Gate config schema: the whole config (:class:`GateConfig`) and each family's section
(``paritygate.config.policy``, ``.causal_lm``, ``.hf_model``).

One file describes one gate: which model family, where the checkpoint, artifact
and probes are, which checks run, their thresholds and the golden directory.
Relative paths resolve against the folder of the config file. :mod:`paritygate.load` reads
and validates a file, the check ids and thresholds included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from paritygate.config.causal_lm import CausalLMSpec
from paritygate.config.hf_model import HFModelSpec
from paritygate.config.policy import PolicySpec
from paritygate.config_base import ConfigPath, StrictModel
from paritygate.errors import InputError, dotted_leaves
from paritygate.precision.config import PrecisionSpec
from paritygate.trainer_output import TrainerCheckpoint, pick_checkpoint

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
