"""Thread counts from the cores the gate is given (paritygate.threads): computed, and set."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from paritygate.errors import InputError
from paritygate.threads import THREADS_ENV, WORKERS_ENV, apply_threads, plan_threads

REPO = Path(__file__).resolve().parents[1]


def test_xdist_workers_share_the_cores() -> None:
    plan = plan_threads(environ={WORKERS_ENV: "2"}, cores=2, torch_default=2)
    assert (plan.torch, plan.onnxruntime) == (1, 1)
    assert plan_threads(environ={WORKERS_ENV: "3"}, cores=16).torch == 5
    assert plan_threads(environ={WORKERS_ENV: "8"}, cores=2).torch == 1  # never below one


def test_a_single_process_keeps_torchs_default_within_its_cores() -> None:
    assert plan_threads(environ={}, cores=2, torch_default=2).torch is None
    assert plan_threads(environ={}, cores=2, torch_default=1).torch is None
    lowered = plan_threads(environ={}, cores=2, torch_default=64)
    assert lowered.torch == 2 and "exceeds" in lowered.reason


def test_config_then_env_override() -> None:
    env = {THREADS_ENV: "3", WORKERS_ENV: "2"}
    assert plan_threads(4, environ=env, cores=2) == plan_threads(4, environ={}, cores=1)
    assert plan_threads(4, environ=env, cores=2).torch == 4
    by_env = plan_threads(environ=env, cores=2)
    assert (by_env.torch, by_env.onnxruntime) == (3, 3) and THREADS_ENV in by_env.reason


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_a_bad_env_value_names_the_variable(bad: str) -> None:
    with pytest.raises(InputError) as info:
        plan_threads(environ={THREADS_ENV: bad}, cores=2)
    assert THREADS_ENV in info.value.line()


def test_apply_sets_torch_and_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from paritygate import threads

    before = torch.get_num_threads()
    monkeypatch.setenv(WORKERS_ENV, "2")
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "cores_given", lambda: 2)
    try:
        plan = apply_threads()
        assert plan.torch == 1 and torch.get_num_threads() == 1
        assert threads.onnxruntime_threads() == 1
        plan = apply_threads(2)
        assert torch.get_num_threads() == 2 and threads.onnxruntime_threads() == 2
    finally:
        torch.set_num_threads(before)
        monkeypatch.setattr(threads, "_PLAN", None)


def test_the_config_key_is_validated(tmp_path: Path) -> None:
    from paritygate.load import config_from_dict

    data = yaml.safe_load((REPO / "configs" / "demo-policy.yaml").read_text())
    with pytest.raises(InputError) as info:
        config_from_dict({**data, "threads": 0}, tmp_path / "gate.yaml")
    assert "threads" in info.value.line()
