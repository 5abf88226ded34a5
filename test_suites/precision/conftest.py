"""Shared fixtures of the precision tests: the zoo models' results, computed once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from precision_zoo import FakeContext, clean_policy, export_onnx, measure, subject

from paritygate.result import Measurement


@pytest.fixture(scope="session")
def clean_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(clean_policy(), tmp_path_factory.mktemp("onnx") / "clean.onnx")


@pytest.fixture(scope="session")
def clean_measurement() -> Measurement:
    return measure(FakeContext(subject(clean_policy)))
