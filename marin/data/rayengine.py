"""The data engine on Ray: a stage's per-shard tasks on the cluster named by ``RAY_ADDRESS``
(else a local Ray), results in input order.

Nothing here assumes a shared filesystem: a task's argument is its shard's bytes (or a batch of
documents and the tokenizer's JSON), its result comes back through Ray's object store, and the
driver alone opens files. Every node imports ``marin`` from its own install, so each task also
reports its node and the code it ran (:func:`_identity`): a node whose marin source, Python or
Arrow/tokenizers versions differ from the driver's is refused in one line naming it, since its
bytes could differ. A node lost mid-stage is Ray's to recover (a lost task is retried elsewhere,
up to 3 times, and a lost result is made again); when it cannot, the stage fails in one line
naming the dead node. The nodes that ran the tasks are printed: ``ray: 12 tasks on 2 nodes: ...``.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from marin import hashing
from marin.errors import MarinError, StageError

T = TypeVar("T")
R = TypeVar("R")
DEAD_WAIT_S = 20  # Ray marks a node dead after a few failed health checks (3 s apart)


@functools.lru_cache(maxsize=1)
def _identity() -> tuple[str, str]:
    """(this process's node as ``host (ip)``, the digest of what decides a task's bytes): marin's
    source files, the Python minor version, the machine, and the pyarrow and tokenizers versions
    (the data determinism class, ``marin.env.data_class``). Once per worker process."""
    import ray

    pkg = Path(__file__).resolve().parent.parent  # the marin package this node imports
    sources = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)
    what = {"marin": hashing.files_digest(pkg, sources), "python": ".".join(map(str, sys.version_info[:2])),
            "machine": os.uname().machine, "byteorder": sys.byteorder,
            "pyarrow": version("pyarrow"), "tokenizers": version("tokenizers")}
    ip = ray.util.get_node_ip_address() if ray.is_initialized() else "?"
    return f"{socket.gethostname()} ({ip})", hashing.json_digest(what)


def _located(fn: Callable[[T], R], item: T) -> tuple[tuple[str, str], R]:
    """One task: ``fn(item)``, with the node that ran it and its code's digest."""
    return _identity(), fn(item)


def _join(workers: int) -> None:
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        else:
            ray.init(num_cpus=workers, log_to_driver=False, include_dashboard=False)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError, ...
        where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray"
        raise StageError(f"cannot start or join {where}: {type(e).__name__}: {str(e).splitlines()[0]}; "
                         "start it (`ray start --head`) or set runtime.data.engine: local") from None


def _live() -> dict[str, str]:
    """The cluster's live nodes: node id -> ``host (ip)``."""
    import ray

    return {n["NodeID"]: f"{n['NodeManagerHostname']} ({n['NodeManagerAddress']})" for n in ray.nodes() if n["Alive"]}


def _lost(nodes: dict[str, str], wait_s: float = DEAD_WAIT_S) -> str:
    """Which of ``nodes`` (live when the stage began) are gone, waiting up to ``wait_s`` for Ray's
    health checks to mark one."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            live = _live()
        except Exception:  # the head itself is gone
            return "the Ray head is unreachable"
        gone = [name for node, name in nodes.items() if node not in live]
        if gone or time.monotonic() > deadline:
            return f"lost Ray node(s): {', '.join(gone)}" if gone else "no Ray node was lost"
        time.sleep(1)


def _result(ref: Any, n: int, driver: str, nodes: dict[str, str], seen: Counter[str]) -> Any:
    import ray
    from ray.exceptions import RayError, RayTaskError

    try:
        (node, code), out = ray.get(ref)
    except RayTaskError as e:  # the task's own error: a MarinError is the stage's one line
        if isinstance(e.cause, MarinError):
            raise e.cause from None
        raise
    except RayError as e:
        raise StageError(f"Ray could not finish task {n} of the stage ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0][:200]}); {_lost(nodes)}; nothing was written: rerun "
                         "once the cluster is whole (`ray status`), or set runtime.data.engine: local") from None
    if code != driver:
        raise StageError(f"Ray node {node} runs other code than this driver ({code} vs {driver}: marin's source, "
                         "Python, pyarrow or tokenizers differ) and could give other bytes; install the same "
                         "commit and `uv sync --frozen` on every node")
    seen[node] += 1
    return out


def ray_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` as Ray tasks, results in input order, at most 2 × ``workers`` in flight
    (``workers``: the CPUs of a local Ray started here; a cluster schedules on its own)."""
    try:
        import ray
    except ImportError:
        raise StageError("runtime.data.engine is ray but Ray is not installed; `uv sync --group ray`, or set "
                         "runtime.data.engine: local") from None
    _join(workers)
    nodes = _live()
    task = ray.remote(scheduling_strategy="SPREAD")(_located)  # every node, not the local one first
    driver = _identity()[1]
    seen: Counter[str] = Counter()
    pending: deque[Any] = deque()
    done = 0
    try:
        for item in items:
            pending.append(task.remote(fn, item))
            if len(pending) >= 2 * workers:
                done += 1
                yield _result(pending.popleft(), done, driver, nodes, seen)
        for ref in pending:
            done += 1
            yield _result(ref, done, driver, nodes, seen)
    except BaseException:
        # the stage's one line names the first failure; the window's other failed tasks are its echoes, which
        # Ray would print as "Unhandled error" tracebacks when their results are dropped at exit
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        raise
    where = ", ".join(f"{node} {k}" for node, k in sorted(seen.items()))
    print(f"ray: {done} tasks on {len(seen)} node{'s' if len(seen) != 1 else ''}: {where}", flush=True)
