"""Suite-wide: every report.json the tests write (in this process and in the CLI and pytest
subprocesses they start) is validated against the published schema as it is written; test
models are built once per test run, shared by every pytest-xdist worker."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

os.environ["PARITYGATE_VALIDATE_REPORTS"] = "1"

SRC = Path(__file__).resolve().parents[1] / "src" / "paritygate"


@cache
def source_digest() -> str:
    """sha256 over the package's files: a build made by other code is never reused."""
    digest = hashlib.sha256()
    for path in sorted(SRC.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(SRC).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


Builder = Callable[..., Any]
BuildOnce = Callable[..., Path]


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> BuildOnce:
    """``build_once(name, build, **params)``: the folder ``build(folder, **params)`` fills,
    built once per test run however many tests and xdist workers ask for it.

    Builds are keyed by the content of their inputs (the name, the parameters, the package's
    source and the versions of the libraries that train and export), kept in the run's
    temporary root that all workers share, and built under a file lock, so a second worker
    waits for the first instead of training again. Callers must treat the folder as
    read-only (the policy zoo asserts its digest)."""
    import filelock
    import torch

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "builds"
    root.mkdir(parents=True, exist_ok=True)
    versions = {"torch": torch.__version__}
    for module in ("onnx", "onnxscript", "transformers", "tokenizers"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None

    def built(name: str, build: Builder, **params: Any) -> Path:
        key = json.dumps([name, params, source_digest(), versions], sort_keys=True, default=str)
        folder = root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        done = folder.with_suffix(".built")
        with filelock.FileLock(str(folder.with_suffix(".lock"))):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a build killed half-way
                build(folder, **params)
                done.write_text(key, encoding="utf-8")
        return folder

    return built


@pytest.fixture(scope="session")
def demo_policy(build_once: BuildOnce) -> Path:
    """The demo policy folder (checkpoint, stats, artifact, manifest), trained once per test
    run for every test that needs it; read-only."""
    from paritygate.demo import policy

    return build_once("demo-policy", lambda out: policy.build(out / "policy")) / "policy"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """In CI (``CI=true``) a real-vLLM test (marked ``vllm``) may not skip: it fails with its
    skip reason. A test that skips in CI never runs, and what never runs rots; .ci/run runs
    these tests in its vLLM venv and deselects them (``-m "not vllm"``) from the main suite."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("CI", "").lower() == "true"
        and item.get_closest_marker("vllm") is not None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true and this real-vLLM test skipped ({reason}); in CI vLLM's CPU build must "
            "be installed (.ci/run does it in .venv-vllm)"
        )
