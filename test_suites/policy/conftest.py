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
from policy_zoo import (
    CONTINUOUS_BASES,
    FAULTS_BY_ID,
    build_continuous,
    checks_of,
    evaluate_all,
    fault_config,
)


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` (proves the clean demo is never modified)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


class Zoo:
    """Builds each fault into its own folder on first use and caches every check's verdict."""

    def __init__(self, clean: Path, root: Path,
                 cartpole: Callable[[], Path] | None = None) -> None:
        self.clean = clean
        self._cartpole = cartpole
        """Builds (once) and returns the PPO CartPole subject of rollout_parity."""
        self.root = root
        self.clean_digest = digest(clean)
        self._results: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, Any] = {}
        """The GateConfig each fault was evaluated with (reports need its paths)."""

    def clean_for(self, base: str) -> Path:
        """The clean subject a fault is built from: the demo, or the continuous policies."""
        if base == "demo":
            return self.clean
        if base == "cartpole":
            assert self._cartpole is not None
            return self._cartpole()
        folder = self.root / "clean-continuous"
        if not (folder / "sac.safetensors").exists():
            build_continuous(folder)
        return folder

    def results(self, fault_id: str) -> dict[str, Any]:
        """``{check_id: CheckResult}`` for a fault id, ``"clean"`` for the clean demo, or a
        base's name (``"sac"``, ``"cleanrl"``, ``"cartpole"``) for that clean subject."""
        if fault_id not in self._results:
            out = self.root / fault_id
            cleans = (*CONTINUOUS_BASES, "cartpole")
            base = fault_id if fault_id in cleans else (
                "demo" if fault_id == "clean" else FAULTS_BY_ID[fault_id].base)
            clean = self.clean_for(base)
            before = digest(clean)
            overrides = ({} if fault_id == "clean" or fault_id in cleans
                         else FAULTS_BY_ID[fault_id].build(clean, out))
            self.configs[fault_id] = fault_config(clean, out, overrides, base)
            self._results[fault_id] = evaluate_all(self.configs[fault_id], checks_of(base))
            assert digest(self.clean) == self.clean_digest, (
                f"building or gating {fault_id!r} modified the clean demo")
            assert digest(clean) == before, f"building or gating {fault_id!r} modified {clean}"
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
    return Zoo(clean_demo, tmp_path_factory.mktemp("policy-zoo"), clean_cartpole)
