"""Orbax checkpoints of the TrainState, and their digest over the restored tensors.

A checkpoint directory ``<dir>/<step>/`` holds the state (OCDBT arrays) and a JSON
``meta`` item (step, loader position, run id, model config). Orbax writes timestamps
and random file names, so checkpoint *files* never hash the same twice; the digest is
taken over the tensors restored from disk (leaf path, dtype, shape, bytes). Orbax saves
asynchronously; a save here blocks until orbax has committed the step (renamed it out of
its ``*.orbax-checkpoint-tmp-*`` folder), and only committed steps are ever listed or
restored, so an interrupted save is invisible.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from marin import fsutil, hashing
from marin.train import distributed


def tensors(state: Any) -> dict[str, np.ndarray]:
    """Every leaf of a pytree as a host array, by its pytree path (``jax.tree_util.keystr``)."""
    return {jax.tree_util.keystr(path): distributed.host_array(leaf)  # gathered across processes if sharded
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


def state_digest(state: Any) -> str:
    """sha256 over (leaf path, dtype, shape, bytes) of every leaf of a pytree."""
    return hashing.tree_digest(tensors(state))


class _Held(logging.Filter):
    """Keeps back orbax's log records while a save runs: re-emitted after it, dropped when the
    save failed on the disk (the failure is then one WriteError line)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.printed: list[tuple[Any, Any, Any]] = []  # what tensorstore's threads print through sys.excepthook
        self.excepthook = sys.excepthook

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def hold(self, t: Any, v: Any, tb: Any) -> None:
        self.printed.append((t, v, tb))

    def release(self, logger: logging.Logger, err: _ThreadsHeld) -> None:
        """The save worked (or failed otherwise): put stderr and the hooks back, show what was held."""
        logger.removeFilter(self)
        sys.excepthook, sys.stderr = self.excepthook, err.stream
        sys.stderr.write("".join(err.kept))
        for r in self.records:
            logger.handle(r)
        for args in self.printed:
            self.excepthook(*args)


class _ThreadsHeld:
    """sys.stderr while a save runs: what other threads write (tensorstore prints tracebacks
    straight to sys.stderr) is kept back, written out after a save that worked, dropped for the
    rest of the process after one that failed on the disk; the main thread writes through."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.kept, self.dropping = stream, [], False

    def write(self, text: str) -> int:
        if threading.current_thread() is threading.main_thread():
            return self.stream.write(text)
        if not self.dropping:
            self.kept.append(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _remove_uncommitted(directory: Path, step: int) -> None:
    for tmp in directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _quiet_after_failure(held: _Held, directory: Path, step: int) -> None:
    """After a save failed on the disk, orbax's threads go on failing (absl and asyncio logs,
    unraisable coroutines, tracebacks tensorstore prints through sys.excepthook) until the
    interpreter shuts down: drop them, so the stage's WriteError stays its one line (or, with
    --verbose, its traceback), and end the process with exit 1 once exit handlers would run (the
    stage has failed and its run is recorded as failed), removing what orbax wrote meanwhile."""
    logging.getLogger("asyncio").addFilter(held)
    sys.unraisablehook = lambda _: None
    threading.excepthook = lambda _: None
    shown = held.excepthook
    sys.excepthook = lambda t, v, tb: shown(t, v, tb) if isinstance(v, fsutil.WriteError) else None

    def exit_now() -> None:
        _remove_uncommitted(directory, step)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    atexit.register(exit_now)  # handlers run last-registered first: this one before orbax's and jax's


class Checkpoints:
    """Every committed checkpoint of one training run (none are deleted: verification
    replays intervals between them)."""

    def __init__(self, directory: Path, create: bool = True):
        self.directory = Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=create,
                                               enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(os.fspath(self.directory), options=options,
                                             item_names=("state", "meta"))

    def steps(self) -> list[int]:
        """Committed steps only."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Save and block until orbax has committed the step. On a failing disk (full, quota,
        I/O error) a WriteError names the step's folder: orbax's uncommitted folder is removed,
        earlier steps are kept, and orbax's own error logs of the failure are dropped (one line)."""
        held = _Held()
        absl = logging.getLogger("absl")
        absl.addFilter(held)
        sys.excepthook = held.hold
        err = sys.stderr = _ThreadsHeld(sys.stderr)
        try:
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
            self.manager.wait_until_finished()
        except Exception as e:
            cause = fsutil.failure_cause(e)
            if cause is None:
                held.release(absl, err)
                raise
            err.dropping = True  # stays sys.stderr: orbax's threads go on failing until the process ends
            _quiet_after_failure(held, self.directory, step)
            with contextlib.suppress(Exception):  # let orbax's save threads end before its folder goes
                self.manager.close()
            _remove_uncommitted(self.directory, step)
            raise fsutil.WriteError(self.path(step), cause) from None
        held.release(absl, err)

    def restore(self, step: int, abstract: Any, shardings: Any) -> tuple[Any, dict[str, Any]]:
        """Restore into the abstract TrainState with the given shardings."""
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, shardings)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
