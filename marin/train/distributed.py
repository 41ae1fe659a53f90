"""Training across processes and hosts with ``jax.distributed``.

``runtime.processes: N`` trains on N processes of ``runtime.devices`` devices each. Every
process runs the same stage code (:func:`worker`); they differ only in how they learn their
place:

- a cluster: every host runs the stage command with ``MARIN_COORDINATOR`` (host:port of
  process 0), ``MARIN_PROCESS_ID`` and ``MARIN_NUM_PROCESSES``, or ``MARIN_CLUSTER=auto`` to
  let JAX detect SLURM, Open MPI, Kubernetes or Cloud TPU;
- one machine (none of these set): the stage is a launcher (:func:`launch_local`) that starts
  the N worker processes itself, on 127.0.0.1 with a free port, sets those variables for
  them, and watches them.

CPU collectives go through gloo. If any process dies, the others stop within a bounded time:
the launcher watches its children (poll every 50 ms) and kills the rest; each child dies
with its launcher (``PR_SET_PDEATHSIG``); a collective that fails because a peer is gone ends
the process at once with :data:`PEER_LOST` (the ledger run stays unfinished, so the next run
resumes it); and the coordination service's heartbeat (:data:`HEARTBEAT_S`) ends processes
whose peer vanished without a word (a dead host).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from marin.config import RuntimeParams
from marin.errors import StageError

if TYPE_CHECKING:
    from marin.env_types import Env

COORDINATOR, PROCESS_ID, NUM_PROCESSES, CLUSTER = ("MARIN_COORDINATOR", "MARIN_PROCESS_ID",
                                                    "MARIN_NUM_PROCESSES", "MARIN_CLUSTER")
WORKER = "MARIN_WORKER"  # set by a launcher (marin/train/launch.py) for the worker processes it starts
PEER_ERROR = "marin: peer error: "
PEER_LOST = 75  # exit status of a process that stopped because another one is gone (EX_TEMPFAIL)
HEARTBEAT_S = 20  # the coordination service declares a silent process dead after this long
POLL_S = 0.05
INIT_TIMEOUT_S = 120
EXCHANGE_TIMEOUT_S = 900  # a process waits this long for process 0 to plan the run (a dead peer ends it sooner)
_EXCHANGES = itertools.count()  # every process exchanges in the same order: the n-th exchange has one key
LOGS = Path(".marin/logs/train")
PEERS = "peers.json"  # in LOGS: every process's id, host and address, and the run, as process 0 saw them


def write_peers(root: Path, processes: list[dict[str, Any]], run_id: str | None) -> None:
    """Who the peers are, for this host's launcher to name one that is gone (every process writes the
    same file: on one host the last replace wins)."""
    (root / LOGS).mkdir(parents=True, exist_ok=True)
    peers = [{k: p.get(k) for k in ("process_id", "host", "ip")} for p in processes]
    tmp = root / LOGS / f"{PEERS}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "processes": peers}))
    os.replace(tmp, root / LOGS / PEERS)


INTERRUPTED = "interrupted.json"  # in LOGS: how the last multi-process run here stopped, for its resumption


def note_interruption(root: Path, run_id: object, line: str) -> None:
    """The launcher of process 0 keeps the line it ended with, for the run's ``run.resumed`` record."""
    if isinstance(run_id, str):
        with contextlib.suppress(OSError):
            (root / LOGS / INTERRUPTED).write_text(json.dumps({"run_id": run_id, "line": line[:1500]}))


def interruption(root: Path, run_id: str) -> str | None:
    """How run ``run_id`` stopped, as its launcher said (once: the note is removed)."""
    from marin import readers
    from marin.errors import MarinError

    path = root / LOGS / INTERRUPTED
    if not path.is_file():  # no launcher here, or nothing stopped it
        return None
    with contextlib.suppress(MarinError, OSError):
        note = readers.read_json(path)
        path.unlink(missing_ok=True)
        if isinstance(note, dict) and note.get("run_id") == run_id:
            return str(note.get("line"))
    return None


@dataclass(frozen=True)
class Topology:
    """Where this process stands: one of ``processes``; ``launch`` when it must start them."""

    processes: int
    process_id: int = 0
    coordinator: str | None = None  # host:port; None with auto-detection or a single process
    auto: bool = False  # JAX's cluster detection
    launch: bool = False  # this process is a launcher (of every process here, or of its host's one), not a worker

    @property
    def primary(self) -> bool:
        """Process 0 writes the ledger, the model, the curve and the MLflow view."""
        return self.process_id == 0 and not self.launch


def topology(rt: RuntimeParams, environ: dict[str, str] | None = None) -> Topology:
    """This process's place, from the environment (see the module docstring)."""
    e = os.environ if environ is None else environ
    if CLUSTER in e:
        if e[CLUSTER] != "auto":
            raise StageError(f"{CLUSTER}={e[CLUSTER]!r}: the only value is 'auto' (JAX's cluster detection); "
                             f"or set {COORDINATOR}, {PROCESS_ID} and {NUM_PROCESSES}")
        return Topology(rt.processes, auto=True)
    given = [k for k in (COORDINATOR, PROCESS_ID, NUM_PROCESSES) if k in e]
    if not given:
        return Topology(rt.processes, launch=rt.processes > 1)
    if len(given) < 3:
        missing = sorted({COORDINATOR, PROCESS_ID, NUM_PROCESSES} - set(given))
        raise StageError(f"{', '.join(given)} set without {', '.join(missing)}; a worker needs all three")
    try:
        n, i = int(e[NUM_PROCESSES]), int(e[PROCESS_ID])
    except ValueError:
        raise StageError(f"{PROCESS_ID}={e[PROCESS_ID]!r}, {NUM_PROCESSES}={e[NUM_PROCESSES]!r}: "
                         "both must be integers") from None
    if n != rt.processes or not 0 <= i < n:
        raise StageError(f"{NUM_PROCESSES}={n}, {PROCESS_ID}={i}: params.yaml runtime.processes is "
                         f"{rt.processes}; every host needs the same params and an id in [0, {rt.processes})")
    return Topology(n, i, e[COORDINATOR], launch=e.get(WORKER) != "1")  # a host's stage starts its worker


# -- a worker --------------------------------------------------------------------------------

def initialize(topo: Topology, rt: RuntimeParams) -> None:
    """Join the other processes (gloo CPU collectives); check the topology JAX sees."""
    if topo.processes == 1 and not topo.auto:
        return
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw: dict[str, Any] = {"initialization_timeout": INIT_TIMEOUT_S, "heartbeat_timeout_seconds": HEARTBEAT_S,
                          "shutdown_timeout_seconds": 30}
    if not topo.auto:
        kw.update(coordinator_address=topo.coordinator, num_processes=topo.processes, process_id=topo.process_id)
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # an unreachable coordinator, a timeout: say where
        raise StageError(f"jax.distributed.initialize ({topo.coordinator or 'cluster auto-detection'}, process "
                         f"{topo.process_id} of {topo.processes}) failed: {str(e).splitlines()[0]}") from None
    if jax.process_count() != rt.processes or jax.local_device_count() != rt.devices:
        raise StageError(f"jax sees {jax.process_count()} process(es) with {jax.local_device_count()} device(s) "
                         f"here; params.yaml asks for runtime.processes {rt.processes} x runtime.devices "
                         f"{rt.devices}")


def shutdown(topo: Topology) -> None:
    """Leave the coordination service together, before process 0 syncs MLflow (so no process
    waits at exit for a peer that is still busy)."""
    if topo.processes > 1 or topo.auto:
        import jax

        jax.distributed.shutdown()


def local_ip(coordinator: str | None) -> str:
    """This host's address on the network that reaches the coordinator (no packet is sent)."""
    host, _, port = (coordinator or "127.0.0.1:1").rpartition(":")
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host.strip("[]"), int(port)))
        return s.getsockname()[0]
    return "unknown"


def process_entry(fp: Env, coordinator: str | None = None) -> dict[str, Any]:
    """What one process records about itself: host, address, devices, thread count, environment."""
    import jax

    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")  # the ledger's clock check
    return {"process_id": jax.process_index(), "host": socket.gethostname(), "ip": local_ip(coordinator), "clock": now,
            "devices": [{"id": d.id, "kind": d.device_kind} for d in jax.local_devices()],
            "xla_cpu_threads": int(os.environ["NPROC"]), "env": fp}


def allgather_json(obj: object) -> list[Any]:
    """Every process's ``obj`` (JSON), in process order; every process must call it, in the same order.
    Through the coordination service's key-value store, not a gloo collective: a process may wait here
    for minutes while process 0 plans the run (a gloo context gives up after 30 s, measured at load 13)."""
    import jax

    data = json.dumps(obj, sort_keys=True)
    if jax.process_count() == 1:
        return [json.loads(data)]
    from jax._src import distributed as jd  # the public API has no key-value store

    client: Any = jd.global_state.client
    n = next(_EXCHANGES)
    client.key_value_set(f"marin/exchange/{n}/{jax.process_index()}", data)
    return [json.loads(client.blocking_key_value_get(f"marin/exchange/{n}/{i}", EXCHANGE_TIMEOUT_S * 1000))
            for i in range(jax.process_count())]


def from_primary(obj: Any) -> Any:
    """Process 0's ``obj`` on every process (a collective)."""
    return allgather_json(obj)[0]


def host_array(x: Any) -> np.ndarray:
    """A whole array on the host: a shard held by other processes is gathered (a collective)."""
    if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
        import jax

        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils as mh

    return np.asarray(mh.process_allgather(x, tiled=True))


@contextlib.contextmanager
def peer_guard(topo: Topology) -> Iterator[None]:
    """A JAX runtime error in a multi-process run means, almost always, that a peer is gone: end
    this process at once with PEER_LOST. Nothing is marked failed (the ledger run stays
    unfinished and the next run resumes it), and no exit handler waits on the dead peer."""
    import jax

    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        if topo.processes == 1:
            raise
        line = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        print(f"{PEER_ERROR}{line}", file=sys.stderr, flush=True)  # for the launcher: which peer it names
        stop_unfinished(f"train: process {topo.process_id} of {topo.processes} stopped: another process is gone "
                        f"({line}); the run stays unfinished: rerun the stage to resume", PEER_LOST)


def stop_unfinished(line: str, code: int = 1) -> NoReturn:
    """End this process now, in one line, leaving the ledger run unfinished (as a kill would), so that
    the next run resumes it; no exit handler runs (none may wait on a peer that is gone)."""
    print(f"marin: error: {line}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


