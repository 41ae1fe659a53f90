"""``marin launch ray -- CMD``: one command on every node of a Ray cluster, as the processes of one
``jax.distributed`` run.

Each of the cluster's live nodes (the head first, then by address) runs ``CMD`` once, or ``--per-node K``
times, in the folder its Ray was started from (each node's own checkout: nothing is shared but the
network): N processes in all, numbered node by node, each with the node's environment (what its
``ray start`` had), the ``--env`` variables given to the launcher, and

    MARIN_COORDINATOR=<the head's address>:<a free port there>  MARIN_PROCESS_ID=i  MARIN_NUM_PROCESSES=N

which is the per-host command of docs/guide/distributed.md, placed by Ray instead of by hand (a task
pinned to each node, taking no CPU from the training). Each process's output goes to
``.marin/logs/launch/process-<i>.log`` on its node; the launcher prints one line per process (its
node, its exit code) and exits 0 when every process did, else 1 in one line naming the first that failed.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections import deque
from pathlib import Path
from typing import Any

from marin.errors import MarinError, StageError

LOGS = Path(".marin/logs/launch")
MAX_PER_NODE = 256  # processes per node: a cap on a count from the user
TAIL_LINES = 1  # the last line of a failed process's output, in the launcher's line


class LaunchError(MarinError):
    exit_code = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(argv: list[str], env: dict[str, str], i: int) -> tuple[str, int, str]:
    """On one node: ``argv`` with the process's variables; (host, exit code, last line of output)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"process-{i}.log"
    with open(log, "wb") as out:
        rc = subprocess.run(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT).returncode
    with open(log, "rb") as f:  # the tail only: a training's log is long
        f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
        last = deque((x for x in f.read(4096).decode(errors="replace").splitlines() if x.strip()), TAIL_LINES)
    return socket.gethostname(), rc, " ".join(last)


def _nodes(ray: Any, n: int | None) -> list[dict[str, Any]]:
    alive = [x for x in ray.nodes() if x["Alive"]]
    alive.sort(key=lambda x: ("node:__internal_head__" not in x["Resources"], x["NodeManagerAddress"]))
    if n is not None and len(alive) < n:
        raise LaunchError(f"--nodes {n}, but the Ray cluster at {os.environ.get('RAY_ADDRESS', 'auto')} has "
                          f"{len(alive)} live node(s); start Ray on the others (`ray start --address ...`)")
    return alive[:n] if n is not None else alive


def _given(extra: list[str]) -> dict[str, str]:
    out = {}
    for item in extra:
        name, sep, value = item.partition("=")
        if not name or (not sep and name not in os.environ):
            raise LaunchError(f"marin launch ray: --env {item}: give NAME=VALUE, or NAME of a variable set here")
        out[name] = value if sep else os.environ[name]
    return out


def launch(argv: list[str], nodes: int | None = None, per_node: int = 1, port: int = 0,
           extra: list[str] | None = None) -> int:
    """``argv`` ``per_node`` times on each node, as process i of N, with ``extra`` (``NAME=VALUE``, or
    ``NAME`` for the launcher's own value) in its environment; 0 when every process exited 0."""
    if not argv:
        raise LaunchError("marin launch ray: no command; give it after --, e.g. "
                          "`marin launch ray -- uv run python -m pipeline.train`")
    if nodes is not None and nodes < 1:
        raise LaunchError(f"marin launch ray: --nodes {nodes}: give 1 or more (or leave it out: every live node)")
    if not 1 <= per_node <= MAX_PER_NODE:
        raise LaunchError(f"marin launch ray: --per-node {per_node}: give 1 to {MAX_PER_NODE} processes per node")
    given = _given(extra or [])
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise LaunchError("marin launch ray needs Ray; `uv sync --group ray`") from None
    address = os.environ.get("RAY_ADDRESS", "auto")
    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    except Exception as e:  # ConnectionError, RuntimeError, ...
        raise LaunchError(f"cannot join the Ray cluster at RAY_ADDRESS={address}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0]}; start it (`ray start --head`) or set RAY_ADDRESS") from None
    chosen = _nodes(ray, nodes)

    def on(node: dict[str, Any]) -> Any:
        return ray.remote(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node["NodeID"], soft=False))  # pyright: ignore[reportArgumentType]

    head = chosen[0]
    port = port or ray.get(on(head)(_free_port).remote())
    procs = [(i * per_node + j, x) for i, x in enumerate(chosen) for j in range(per_node)]  # node by node
    env = {**given, "MARIN_COORDINATOR": f"{head['NodeManagerAddress']}:{port}",
           "MARIN_NUM_PROCESSES": str(len(procs))}
    refs = [on(x)(_run).remote(argv, {**env, "MARIN_PROCESS_ID": str(i)}, i) for i, x in procs]
    first: tuple[int, int] | None = None  # (process, exit code) of the first that failed
    for (i, x), ref in zip(procs, refs, strict=True):
        try:
            host, rc, last = ray.get(ref)
        except ray.exceptions.RayError as e:  # pyright: ignore[reportAttributeAccessIssue]
            host, rc, last = x["NodeManagerHostname"], 1, f"lost: {type(e).__name__}"
        where = f"process {i} on {host} ({x['NodeManagerAddress']})"
        print(f"marin launch: {where} exited {rc}" + (f": {last}" if rc and last else ""), flush=True)
        if rc and first is None:
            first = (i, rc)
    if first is not None:
        raise StageError(f"process {first[0]} of {len(procs)} exited {first[1]}; its output is "
                         f"{LOGS}/process-{first[0]}.log on its node")
    return 0
