"""A real Ray head on 127.0.0.1 for the data-stage tests: ``ray start --head``, joined by the
stages through ``RAY_ADDRESS``, stopped at the end (every process of its session, by id)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.conftest import BIN, env_for_subprocess

# pytest runs under `uv run`, and Ray then starts its workers with `uv run` in a copy of the
# project (which cannot build without README.md); the stage's own interpreter is what we test
NO_UV_HOOK = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes(temp_dir: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in a for a in p.info["cmdline"] or ()):
                out.append(p)
        except psutil.Error:
            continue
    return out


@contextmanager
def ray_head(cwd: Path, num_cpus: int = 2) -> Iterator[dict[str, str]]:
    """A head on a free port; yields the environment a stage needs to join it (RAY_ADDRESS,
    the cluster's auth token). On exit it is stopped, and no process of its session is left."""
    port, temp_dir = free_port(), tempfile.mkdtemp(prefix="ray", dir="/tmp")  # a short path: Ray's sockets live in it
    # Ray 2.60 heads require a token: this cluster's own, given to the head and the stages alike
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), **NO_UV_HOOK}
    # --block: the head lives as long as this one process, and takes its processes with it on SIGTERM
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}",
                             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
                             "--block"], cwd=cwd, env={**env_for_subprocess(), **auth}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, head)
        yield {**auth, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        _stop(head, temp_dir)
        left = ray_processes(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, f"processes of the Ray head left running: {left}"


def _wait_for_port(port: int, head: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert head.poll() is None, "ray start exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"the Ray head did not listen on {port} within {timeout} s")


def _stop(head: subprocess.Popen, temp_dir: str) -> None:
    """The head and every process of its session, by id: nothing else on this machine."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(10)
    for p in ray_processes(temp_dir):
        p.kill()
    psutil.wait_procs(ray_processes(temp_dir), timeout=10)
