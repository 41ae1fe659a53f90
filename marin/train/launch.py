"""Launchers of the training processes: every process of a run on one machine, or a host's own.

``runtime.processes: N`` on one machine: the stage starts the N workers on 127.0.0.1 with a free
port. On a cluster every host runs the stage with ``MARIN_COORDINATOR``, ``MARIN_PROCESS_ID`` and
``MARIN_NUM_PROCESSES``, and the stage starts that one worker. Either way the launcher watches its
workers: when one fails it stops the others here, names the process that is gone (and its host and
address, from what process 0 wrote in ``peers.json``), records the interruption in the ledger when
it holds process 0, and ends in one line. Each worker dies with its launcher (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from marin import readers
from marin.errors import MarinError, StageError
from marin.train import distributed
from marin.train.distributed import (
    COORDINATOR,
    LOGS,
    NUM_PROCESSES,
    PEER_ERROR,
    PEER_LOST,
    PEERS,
    POLL_S,
    PROCESS_ID,
    WORKER,
    Topology,
)

_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*([\d,\s]+)")
TAIL = 256 << 10  # bytes of a worker's log read back: its end, where it says why it stopped
_ADDRESS = re.compile(r"\[?(\d{1,3}(?:\.\d{1,3}){3})\]?:\d+")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a child, before exec: SIGKILL when the launcher dies (Linux), so no worker outlives it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def how(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-rc).name}"
        return f"was killed by signal {-rc}"
    return "stopped because another process was gone" if rc == PEER_LOST else f"exited with status {rc}"


def _log_text(log: Path) -> str:
    with contextlib.suppress(OSError), open(log, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL))  # its end: where a worker says why it stopped
        return f.read(TAIL).decode(errors="replace")
    return ""


def _last_error(text: str) -> str:
    """The worker's own one-line error, if its log has one."""
    lines = [x for x in text.splitlines() if x.startswith("marin: error: ")]
    return ": " + lines[-1].removeprefix("marin: error: ") if lines else ""


def peers(root: Path) -> dict[str, Any]:
    """What process 0 (or this host's process) wrote of the peers; {} when there is nothing readable."""
    with contextlib.suppress(MarinError):
        found = readers.read_json(root / LOGS / PEERS)
        return cast("dict[str, Any]", found) if isinstance(found, dict) else {}
    return {}


def gone(text: str, me: int, processes: int, known: list[dict[str, Any]]) -> list[int]:
    """Which processes a worker's log says are gone: the coordination service's unhealthy tasks, a
    peer address in a failed connection, a heartbeat the coordinator (process 0) never answered;
    else every other process."""
    if m := _UNHEALTHY.search(text):
        return sorted({int(x) for x in re.split(r"[,\s]+", m.group(1).strip()) if x.isdigit()} - {me})
    peer_lines = [x for x in text.splitlines() if x.startswith(PEER_ERROR) or "onnection" in x]
    by_ip = {p.get("ip"): p["process_id"] for p in known if p.get("process_id") != me}
    hit = sorted({by_ip[a] for line in peer_lines for a in _ADDRESS.findall(line) if a in by_ip})
    if hit:
        return hit
    if me != 0 and re.search(r"Heartbeat|coordination service|DEADLINE_EXCEEDED|UNAVAILABLE", text):
        return [0]
    return [i for i in range(processes) if i != me]


def named(ids: list[int], known: list[dict[str, Any]]) -> str:
    where = {p["process_id"]: p for p in known}
    return ", ".join(f"process {i} ({where[i]['host']}, {where[i]['ip']})" if i in where else f"process {i}"
                     for i in ids)


def _fatal_line(text: str) -> str:
    """The reason a worker gave: its own one-line error, else JAX's fatal status, shortened."""
    if own := _last_error(text):
        return own.removeprefix(": ")
    for x in text.splitlines():
        if "absl::Status:" in x:
            return x.split("absl::Status:", 1)[1].strip()[:200]
        if x.startswith(PEER_ERROR):
            return x.removeprefix(PEER_ERROR)[:200]
    return ""


def launch(root: Path, topo: Topology, argv: list[str] | None = None) -> None:
    """Start this machine's workers (every process, or this host's one) and wait for them; if one fails,
    stop the others here and raise one StageError naming the process that is gone."""
    local = topo.coordinator is None
    coordinator = f"127.0.0.1:{free_port()}" if local else str(topo.coordinator)
    ids = list(range(topo.processes)) if local else [topo.process_id]
    logs = root / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    argv = argv or [sys.executable, *_self_argv()]
    print(f"train: process(es) {', '.join(map(str, ids))} of {topo.processes}, coordinator {coordinator} "
          f"(progress and errors: {LOGS}/process-<i>.log)", flush=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in ids:
            env = {**os.environ, COORDINATOR: coordinator, PROCESS_ID: str(i), NUM_PROCESSES: str(topo.processes),
                   WORKER: "1"}
            with open(logs / f"process-{i}.log", "wb") as log:
                procs.append(subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              preexec_fn=_die_with_parent))
        failed = _watch(procs)
    finally:
        _stop(procs)  # also on KeyboardInterrupt or an error of the launcher itself
    if not failed:  # the summary lines of the lowest process here (process 0's on its host)
        text = _log_text(logs / f"process-{ids[0]}.log")
        print("\n".join(x for x in text.splitlines() if x.startswith("train: ") and "%|" not in x), flush=True)
        return
    line = _failure_line(root, topo, ids[failed[0]], procs[failed[0]], local)
    if 0 in ids:  # this host holds the ledger: the run's resumption records why it stopped
        distributed.note_interruption(root, peers(root).get("run_id"), line)
    raise StageError(line)


def _failure_line(root: Path, topo: Topology, first: int, proc: subprocess.Popen[bytes], local: bool) -> str:
    text = _log_text(root / LOGS / f"process-{first}.log")
    peer_loss = proc.returncode == PEER_LOST or re.search(r"distributed service|Heartbeat|unhealthy", text)
    known = peers(root).get("processes", [])
    rerun = ("the run stays unfinished: rerun the stage (dvc repro) on every host to resume it from its last "
             f"checkpoint (logs: {LOGS}/)")
    if not peer_loss or (local and proc.returncode != PEER_LOST):
        return (f"train: process {first} of {topo.processes} (pid {proc.pid}) {how(proc.returncode)}"
                f"{_last_error(text)}; the other process(es) here were stopped; {rerun}")
    lost = gone(text, first, topo.processes, known)
    why = _fatal_line(text)
    return (f"train: {named(lost, known)} is gone (no answer within the coordination service's heartbeat): "
            f"process {first} on {socket.gethostname()} stopped{f' ({why})' if why else ''}; {rerun}")


def _self_argv() -> list[str]:
    """How this stage was started (``-m pipeline.train``, or a script path)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["-m", spec.name, *sys.argv[1:]]
    return list(sys.argv)


def _watch(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Wait until every process ended well, or one failed; the failed ones, the cause first."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            time.sleep(POLL_S)  # a peer's own exit lands right after: name the cause, not the echo
            bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            bad.sort(key=lambda i: (procs[i].returncode == PEER_LOST, i))
            return bad
        if all(c == 0 for c in codes):
            return []
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every live worker. Not SIGTERM: jax's preemption notifier catches it (measured: a
    worker went on training for the whole grace period). A killed worker leaves nothing half
    written: ledger appends are atomic, and orbax ignores an uncommitted checkpoint."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    for p in procs:
        p.wait()
