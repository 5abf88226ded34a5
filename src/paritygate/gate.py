"""The gate: one config, one loaded context, every check measured and judged the same way.

The CLI, the pytest plugin and the gate files all go through :class:`Gate`:
``Gate.evaluate(check_id)`` measures, judges against thresholds and golden, and
handles the golden life cycle (missing -> write ``.obtained`` and fail;
``update_golden`` -> bless atomically).
"""

from __future__ import annotations

import hashlib
import importlib
import platform
import sys
import time
import traceback
from collections.abc import Mapping
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any

from paritygate.check import CheckSpec
from paritygate.checks import checks_for, get_check
from paritygate.config import GateConfig, load_config
from paritygate.errors import InputError
from paritygate.golden import GoldenStore
from paritygate.result import CheckResult, Measurement
from paritygate.verdict import Margin, judge

CONTEXT_BUILDERS: dict[str, str] = {
    "policy": "paritygate.families.policy:build_policy_context",
    "causal_lm": "paritygate.lm.context:build_lm_context",
}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Streaming sha256 of a file (checkpoints can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_files(files: list[Path]) -> str:
    """sha256 of a checkpoint stored as one file (equal to ``sha256sum``) or as shards
    (digest of each shard's name and sha256, in the given order)."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()


def environment() -> dict[str, Any]:
    """Versions that influence the numbers, recorded in reports and golden provenance."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("paritygate", "numpy", "torch", "onnx", "onnxruntime", "transformers", "vllm"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return env


class Gate:
    """A gate run over one config."""

    def __init__(self, config: GateConfig, *, update_golden: bool = False) -> None:
        self.config = config
        self.update_golden = update_golden
        self.golden = GoldenStore(config.golden_dir())
        self.margin = Margin(config.golden.rel_margin, config.golden.threshold_fraction)

    @classmethod
    def from_path(cls, path: str | Path, *, update_golden: bool = False) -> Gate:
        return cls(load_config(path), update_golden=update_golden)

    @cached_property
    def context(self) -> Any:
        """The family context, built once; raises :class:`InputError` on bad input."""
        module_name, func = CONTEXT_BUILDERS[self.config.family].split(":")
        builder = getattr(importlib.import_module(module_name), func)
        return builder(self.config)

    def checks(self) -> list[CheckSpec]:
        """Checks this gate runs, in checklist order."""
        selected = checks_for(self.config.family)
        if self.config.checks is not None:
            wanted = set(self.config.checks)
            selected = [c for c in selected if c.id in wanted]
        return [c for c in selected if c.id not in self.config.skip_checks]

    def thresholds(self, spec: CheckSpec) -> dict[str, float]:
        merged = dict(spec.defaults)
        merged.update(self.config.thresholds.get(spec.id, {}))
        return merged

    def measure(self, check_id: str) -> Measurement:
        """Run one check's measurement (no verdict)."""
        spec = get_check(check_id)
        if self.config.family not in spec.families:
            return Measurement(check_id).skip(
                f"{check_id} does not apply to the {self.config.family!r} family"
            )
        return spec.measure(self.context, self.thresholds(spec))

    def provenance(self) -> dict[str, Any]:
        ctx = self.context
        # Hash of the validated config, so comments and formatting do not count as changes.
        config_hash = hashlib.sha256(self.config.model_dump_json().encode()).hexdigest()
        return {
            "checkpoint_sha256": ctx.checkpoint_sha256,
            "probes_sha256": ctx.probes_sha256,
            "config_sha256": config_hash,
            "bless_command": self.bless_command(),
            "environment": environment(),
        }

    def bless_command(self) -> str:
        try:
            cfg = self.config.path.relative_to(Path.cwd())
        except ValueError:
            cfg = self.config.path
        return f"paritygate run {cfg} --update-golden"

    def evaluate(self, check_id: str, *, golden: bool = True) -> CheckResult:
        """Measure, judge and run the golden life cycle for one check.

        Bad input propagates as :class:`InputError`; any other exception becomes
        an ``error`` result carrying the traceback's last line.
        """
        start = time.perf_counter()
        try:
            measurement = self.measure(check_id)
        except InputError:
            raise
        except Exception as exc:  # a check crashing is a gate error, reported by name
            tb = traceback.format_exc(limit=-3)
            return CheckResult(
                check_id,
                "error",
                f"{type(exc).__name__}: {exc}",
                {},
                None,
                {},
                details={"traceback": tb},
                duration_s=time.perf_counter() - start,
            )
        expected = self.golden.load(check_id) if golden else None
        blessing = golden and self.update_golden
        result = judge(
            measurement, expected, margin=self.margin, use_golden=golden, blessing=blessing
        )
        if golden and expected is not None and not blessing and result.status in ("pass", "fail"):
            self._check_probe_set(result, expected)
        if golden and result.status in ("pass", "fail"):
            self._golden_lifecycle(result, measurement, blessing)
        result.duration_s = time.perf_counter() - start
        return result

    def _check_probe_set(self, result: CheckResult, expected: dict[str, Any]) -> None:
        """Golden numbers are only comparable on the probes they were blessed with."""
        blessed = (expected.get("provenance") or {}).get("probes_sha256")
        current = self.context.probes_sha256
        if blessed and blessed != current:
            reason = (
                f"probe set changed since the golden baseline was blessed (sha256 "
                f"{blessed[:12]} -> {current[:12]})"
            )
            was_passing = result.status == "pass"
            result.reasons.append(reason)
            result.status = "fail"
            result.message = reason if was_passing else f"{result.message}; {reason}"

    def _golden_lifecycle(
        self, result: CheckResult, measurement: Measurement, blessing: bool
    ) -> None:
        ratcheted = {n: m.value for n, m in measurement.metrics.items() if m.ratchet}
        if blessing:
            if result.status == "pass":
                path = self.golden.write(result.id, ratcheted, self.provenance())
                result.message += f" (golden blessed: {path.name})"
            else:
                result.message += " (not blessed: the check fails its thresholds)"
            return
        if result.status == "fail" and (
            result.golden is None or any("golden" in r for r in result.reasons)
        ):
            path = self.golden.write_obtained(result.id, ratcheted, self.provenance())
            result.details["obtained_path"] = str(path)
            result.message += f"; obtained metrics written to {path}"
            if all("golden" in r for r in result.reasons):  # blessing would make it pass
                result.message += f"; bless with: {self.bless_command()}"

    def run(self, select: Mapping[str, bool] | None = None) -> list[CheckResult]:
        """Evaluate every applicable check (``select`` maps id -> run?)."""
        return [self.evaluate(c.id) for c in self.checks() if select is None or select.get(c.id)]
