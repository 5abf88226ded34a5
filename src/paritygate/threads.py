"""How many intra-op threads the gate's torch and ONNX Runtime use: the cores it is given.

A gate process runs on the cores its affinity mask allows (``os.sched_getaffinity``: a
container's cpuset, ``taskset``), shared with the other pytest-xdist workers of its session
(``PYTEST_XDIST_WORKER_COUNT``). Each worker gets its share, at least one, so ``-n 2`` on a
2-core runner runs one thread per worker instead of two each. A single process keeps torch's
own default unless that default exceeds the cores given (its numbers then stay those of
the snapshots, which were made with the default). ONNX Runtime keeps its deterministic single
intra-op thread unless a count is set. Set the count with the config's ``threads`` key or
``PARITYGATE_THREADS`` (the config wins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["THREADS_ENV", "ThreadPlan", "apply_threads", "cores_given", "plan_threads"]

THREADS_ENV = "PARITYGATE_THREADS"
"""Environment override of the thread count (a positive integer)."""
WORKERS_ENV = "PYTEST_XDIST_WORKER_COUNT"
"""Set by pytest-xdist in each worker: how many workers share the cores."""


@dataclass(frozen=True)
class ThreadPlan:
    """The thread counts chosen, and why (shown in the gate's notes on request)."""

    torch: int | None
    """torch's intra-op threads; ``None``: leave torch's default."""
    onnxruntime: int
    """ONNX Runtime's intra-op threads."""
    reason: str


def cores_given() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def _positive(text: str | None, what: str) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        from paritygate.errors import InputError

        raise InputError(None, what, f"must be a positive integer (got {text!r})")
    return value


def plan_threads(
    configured: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cores: int | None = None,
    torch_default: int | None = None,
) -> ThreadPlan:
    """The thread counts for this process.

    ``configured`` is the config's ``threads``; ``environ`` defaults to ``os.environ``,
    ``cores`` to :func:`cores_given`, ``torch_default`` to torch's current count (read only
    when torch is already imported; otherwise it is not lowered for a single process)."""
    env = os.environ if environ is None else environ
    override = configured if configured is not None else _positive(env.get(THREADS_ENV),
                                                                    THREADS_ENV)
    if override is not None:
        source = "threads in the config" if configured is not None else THREADS_ENV
        return ThreadPlan(override, override, f"{override} thread(s): {source}")
    cores = cores_given() if cores is None else cores
    workers = _positive(env.get(WORKERS_ENV), WORKERS_ENV) or 1
    share = max(1, cores // workers)
    if workers > 1:
        return ThreadPlan(share, 1, f"{share} thread(s): {cores} core(s) shared by "
                          f"{workers} xdist workers")
    if torch_default is not None and torch_default > cores:
        return ThreadPlan(cores, 1, f"{cores} thread(s): the cores given (torch's default "
                          f"{torch_default} exceeds them)")
    return ThreadPlan(None, 1, f"torch's default thread count ({cores} core(s) given)")


def apply_threads(configured: int | None = None) -> ThreadPlan:
    """Plan the thread counts and set torch's (ONNX Runtime's is read when a session is
    made: :func:`paritygate.engines.onnxruntime_engine.make_session`)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    plan = plan_threads(configured, torch_default=torch.get_num_threads() if torch else None)
    if torch is not None and plan.torch is not None and torch.get_num_threads() != plan.torch:
        torch.set_num_threads(plan.torch)
    global _PLAN
    _PLAN = plan
    return plan


_PLAN: ThreadPlan | None = None


def onnxruntime_threads() -> int:
    """ONNX Runtime's intra-op threads for a session made now (1 until a plan is applied)."""
    return _PLAN.onnxruntime if _PLAN is not None else 1
