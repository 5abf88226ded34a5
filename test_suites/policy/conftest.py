"""Policy fault-zoo fixtures: the clean demo is built once per session, each fault once.

Faulty models and preprocessing live in ``paritygate.demo.faults`` (importable from
any process, so pytest-xdist workers and ``paritygate run`` subprocesses see them);
the registry ``policy_zoo.py`` sits beside this file.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from policy_zoo import CONTINUOUS_BASES, FAULTS_BY_ID, build_continuous, evaluate_all, fault_config


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` (proves the clean demo is never modified)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


class Zoo:
    """Builds each fault into its own folder on first use and caches every check's verdict."""

    def __init__(self, clean: Path, root: Path) -> None:
        self.clean = clean
        self.root = root
        self.clean_digest = digest(clean)
        self._results: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, Any] = {}
        """The GateConfig each fault was evaluated with (reports need its paths)."""

    def clean_for(self, base: str) -> Path:
        """The clean subject a fault is built from: the demo, or the continuous policies."""
        if base == "demo":
            return self.clean
        folder = self.root / "clean-continuous"
        if not (folder / "sac.safetensors").exists():
            build_continuous(folder)
        return folder

    def results(self, fault_id: str) -> dict[str, Any]:
        """``{check_id: CheckResult}`` for a fault id, ``"clean"`` for the clean demo, or a
        continuous base's name (``"sac"``, ``"cleanrl"``) for that clean subject."""
        if fault_id not in self._results:
            out = self.root / fault_id
            base = fault_id if fault_id in CONTINUOUS_BASES else (
                "demo" if fault_id == "clean" else FAULTS_BY_ID[fault_id].base)
            clean = self.clean_for(base)
            overrides = ({} if fault_id == "clean" or fault_id in CONTINUOUS_BASES
                         else FAULTS_BY_ID[fault_id].build(clean, out))
            self.configs[fault_id] = fault_config(clean, out, overrides, base)
            self._results[fault_id] = evaluate_all(self.configs[fault_id])
            assert digest(self.clean) == self.clean_digest, (
                f"building or gating {fault_id!r} modified the clean demo")
        return self._results[fault_id]


@pytest.fixture(scope="session")
def clean_demo(demo_policy: Path) -> Path:
    """The demo policy (checkpoint, stats, artifact, manifest), built once per test run."""
    return demo_policy


@pytest.fixture(scope="session")
def zoo(clean_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return Zoo(clean_demo, tmp_path_factory.mktemp("policy-zoo"))
