"""Policy fault-zoo fixtures: the clean demo is built once per session, each fault once.

Faulty models and preprocessing live in ``paritygate.demo.faults`` (importable from
any process, so pytest-xdist workers and ``paritygate run`` subprocesses see them);
the registry ``policy_zoo.py`` sits beside this file.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import rollout_subjects
from policy_zoo import FAULTS_BY_ID, SUBJECT_CHECKS, evaluate_all, fault_config


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` (proves the clean demo is never modified)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


class Zoo:
    """Builds each fault into its own folder on first use and caches every check's verdict.

    ``subjects`` maps a subject name onto a function returning its clean folder (built on
    first use: the CartPole subject trains PPO only when one of its faults is asked for)."""

    def __init__(self, subjects: dict[str, Callable[[], Path]], root: Path) -> None:
        self._subjects = subjects
        self._cleans: dict[str, tuple[Path, dict[str, str]]] = {}
        self.root = root
        self._results: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, Any] = {}
        """The GateConfig each fault was evaluated with (reports need its paths)."""

    def clean(self, subject: str = "demo") -> Path:
        if subject not in self._cleans:
            folder = self._subjects[subject]()
            self._cleans[subject] = (folder, digest(folder))
        return self._cleans[subject][0]

    def results(self, fault_id: str) -> dict[str, Any]:
        """``{check_id: CheckResult}`` for a fault id, or ``"clean"`` / ``"clean:<subject>"``
        for a clean subject."""
        if fault_id not in self._results:
            out = self.root / fault_id.replace(":", "-")
            if fault_id.startswith("clean"):
                subject = fault_id.partition(":")[2] or "demo"
                overrides: dict[str, Any] = {}
            else:
                subject = FAULTS_BY_ID[fault_id].subject
                overrides = FAULTS_BY_ID[fault_id].build(self.clean(subject), out)
            clean = self.clean(subject)
            self.configs[fault_id] = fault_config(clean, out, overrides, subject)
            self._results[fault_id] = evaluate_all(self.configs[fault_id],
                                                   SUBJECT_CHECKS[subject])
            assert digest(clean) == self._cleans[subject][1], (
                f"building or gating {fault_id!r} modified the clean {subject}")
        return self._results[fault_id]


@pytest.fixture(scope="session")
def clean_demo(demo_policy: Path) -> Path:
    """The demo policy (checkpoint, stats, artifact, manifest), built once per test run."""
    return demo_policy


@pytest.fixture(scope="session")
def clean_cartpole(build_once: Any) -> Callable[[], Path]:
    """The PPO CartPole subject of rollout_parity (zip, stats, probes, artifact), trained
    once per test run on first call; read-only."""
    return lambda: build_once("cartpole-ppo", rollout_subjects.train_cartpole)


@pytest.fixture(scope="session")
def zoo(clean_demo: Path, clean_cartpole: Callable[[], Path],
        tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return Zoo({"demo": lambda: clean_demo, "cartpole": clean_cartpole},
               tmp_path_factory.mktemp("policy-zoo"))
