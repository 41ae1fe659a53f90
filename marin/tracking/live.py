"""Training metrics in MLflow while training runs.

A daemon thread tails the run's ledger file and sends the metric records appended since its
last look in one ``log_batch``: every ``MARIN_MLFLOW_LIVE_EVERY`` metric records (default 10)
or every ``MARIN_MLFLOW_LIVE_SECONDS`` (default 15), whichever comes first. The training loop
only counts (:meth:`Live.step`); the thread reads what the ledger already holds, so MLflow can
never show a value the ledger lacks. It sends the same (key, value, step, timestamp) the final
sync sends, which MLflow stores once, so the final sync reconciles whatever the thread missed.
Any failure (MLflow down, slow, refusing) stops the thread with one note line; training goes
on, and the stage's own sync after it (or a later ``marin mlflow sync``) completes the view.
``MARIN_MLFLOW_LIVE=off`` turns it off; ``MARIN_MLFLOW=off`` turns off all syncing.

The thread's CPU time is kept in :attr:`Live.cpu_s` (benchmarks/bench_live_metrics.py reports
it per step). It runs at the process's priority: at nice 19 it starved while XLA's threads kept
every core busy, and no metric reached MLflow before the stage ended (tests/test_team.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from marin.paths import ledger_dir


def _off(name: str) -> bool:
    return os.environ.get(name, "on").lower() in ("0", "off", "false", "no")


class Live:
    """Live metrics for one ledger run; a no-op when syncing is off (see :meth:`start`)."""

    def __init__(self, root: Path, run_id: str, every: int, seconds: float):
        self.root, self.run_id, self.every, self.seconds = root, run_id, every, seconds
        self.path = ledger_dir(root) / f"{run_id}.jsonl"
        self.pending = 0  # metric records the loop wrote since the last wake-up
        self.sent = 0  # metric values logged to MLflow
        self.failed: str | None = None
        self.cpu_s = 0.0  # CPU seconds the thread used (start-up included)
        self.ready = threading.Event()  # set once the MLflow run exists (or the thread stopped)
        self._offset = 0
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._main, name="marin-live-metrics", daemon=True)

    @classmethod
    def start(cls, root: Path, run_id: str, enabled: bool = True) -> Live:
        """The live view of ``run_id``, running when ``enabled`` (the process writing the ledger)
        unless MARIN_MLFLOW or MARIN_MLFLOW_LIVE is off."""
        live = cls(root, run_id, max(1, int(os.environ.get("MARIN_MLFLOW_LIVE_EVERY", "10"))),
                   float(os.environ.get("MARIN_MLFLOW_LIVE_SECONDS", "15")))
        if enabled and not (_off("MARIN_MLFLOW") or _off("MARIN_MLFLOW_LIVE")):
            live._thread.start()
        return live

    def step(self) -> None:
        """The loop wrote a metric record: wake the thread after ``every`` of them (no I/O here)."""
        if not self._thread.is_alive():
            return
        self.pending += 1
        if self.pending >= self.every:
            self.pending = 0
            self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is left and stop, waiting at most ``timeout`` s (the stage's sync follows)."""
        if self._thread.is_alive():
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            from marin.ledger.store import read_run
            from marin.net import mlflow_env
            from marin.tracking.sync import _Syncer, default_uri

            mlflow_env()  # before MLflow's client reads its environment
            self.syncer = _Syncer(self.root, default_uri(self.root))
            log = read_run(self.path, validate=False)  # run.started and the inputs are written by now
            self.mlflow_id = self.syncer.stage_run(log)[0].info.run_id
            self._offset = 0
            self.cpu_s = time.thread_time()
            self.ready.set()
            while True:
                self._wake.wait(self.seconds)
                self._wake.clear()
                stopping = self._stop.is_set()  # read before sending: close() comes after the last record
                self._send()
                self.cpu_s = time.thread_time()
                if stopping:
                    return
        except Exception as e:  # never the training's problem: say so once, the final sync catches up
            self.failed = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            print(f"marin: note: live metrics to MLflow stopped ({self.failed}); the ledger has them, and the "
                  "sync after the stage (or `marin mlflow sync`) sends them", file=sys.stderr)
        finally:
            self.cpu_s = time.thread_time()
            self.ready.set()

    def _send(self) -> None:
        from marin.ledger.records import Record

        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # only whole lines: the loop may be appending one
        self._offset += end
        metrics: list[Any] = []
        for line in data[:end].splitlines():
            r = Record.from_line(line, str(self.path), validate=False)
            if r.kind == "metric":
                metrics += self.syncer._metrics(r, None)
        for i in range(0, len(metrics), 900):
            self.syncer.client.log_batch(self.mlflow_id, metrics=metrics[i : i + 900])
        self.sent += len(metrics)
