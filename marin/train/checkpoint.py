"""Orbax checkpoints of the TrainState, and their digest over the restored tensors.

A checkpoint directory ``<dir>/<step>/`` holds the state (OCDBT arrays) and a JSON
``meta`` item (step, loader position, run id, model config). Orbax writes timestamps
and random file names, so checkpoint *files* never hash the same twice; the digest is
taken over the tensors restored from disk (leaf path, dtype, shape, bytes). A save here
is synchronous: it returns once orbax has committed the step (renamed it out of its
``*.orbax-checkpoint-tmp-*`` folder), and only committed steps are ever listed or
restored, so an interrupted save is invisible.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
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


class _Reports:
    """What orbax's and tensorstore's threads report (absl and asyncio log records, exceptions that
    end a thread or that nothing could raise, tracebacks printed through ``sys.excepthook``), routed
    through hooks installed once while any Checkpoints is open (a train stage), not per save: held
    while a save runs and shown once it worked; dropped when it failed on the disk, and from then on
    (orbax's callbacks go on failing), so the stage's WriteError stays its one line. Outside a save,
    before any failure, every report passes straight through."""

    LOGGERS = ("absl", "asyncio")

    def __init__(self) -> None:
        self.users, self.saving, self.failed = 0, False, False
        self.held: list[Callable[[], object]] = []
        self.hooks: tuple[Any, Any, Any] | None = None

    def open(self) -> None:
        self.users += 1
        if self.hooks is not None:
            return
        self.hooks = sys.excepthook, threading.excepthook, sys.unraisablehook
        sys.excepthook = self._routed(sys.excepthook, lambda t, v, tb: v)
        threading.excepthook = self._routed(threading.excepthook, lambda a: a.exc_value)
        sys.unraisablehook = self._routed(sys.unraisablehook, lambda u: u.exc_value)
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self._log)

    def close(self) -> None:
        """The last Checkpoints closed: the hooks go, unless a save failed (reports go on coming)."""
        self.users -= 1
        if self.users > 0 or self.hooks is None or self.failed:
            return
        sys.excepthook, threading.excepthook, sys.unraisablehook = self.hooks
        self.hooks = None
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self._log)

    def _passes(self, e: BaseException | None, later: Callable[[], object]) -> bool:
        """True: it passes now. Held while a save runs (``later`` shows it), dropped after a failure;
        the stage's own WriteError (its traceback, with --verbose) always passes."""
        if isinstance(e, fsutil.WriteError) or not (self.saving or self.failed):
            return True
        if not self.failed:
            self.held.append(later)
        return False

    def _routed(self, hook: Callable[..., object], exc: Callable[..., BaseException | None]) -> Callable[..., None]:
        def routed(*args: Any) -> None:
            if self._passes(exc(*args), lambda: hook(*args)):
                hook(*args)
        return routed

    def _log(self, record: logging.LogRecord) -> bool:
        return self._passes(None, lambda: logging.getLogger(record.name).handle(record))

    def done(self, failed_on_disk: bool) -> None:
        """The save ended: show what was held, or (it failed on the disk) drop it and all that follows."""
        self.failed = self.failed or failed_on_disk
        self.saving, held, self.held = False, self.held, []
        if not failed_on_disk:
            for show in held:
                show()


_REPORTS = _Reports()


def _remove_uncommitted(directory: Path, step: int) -> None:
    for tmp in directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(tmp, ignore_errors=True)


def host_state(state: Any) -> Any:
    """The state as host (numpy) arrays, each whole: what a multi-process run's process 0 saves. A
    collective where a leaf is sharded over processes (fsdp): every process calls it."""
    return jax.tree.map(distributed.host_array, state)


def placed(host: Any, shardings: Any) -> Any:
    """Host arrays placed on the mesh with their shardings: each process puts only its own shards."""
    return jax.tree.map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda idx: a[idx]), host, shardings)


class Checkpoints:
    """Every committed checkpoint of one training run (none are deleted: verification
    replays intervals between them).

    With several processes each process's manager is its own (orbax's ``active_processes`` is just
    this one): process 0 alone saves the whole state as host arrays, and every process restores from
    the folder it has, so hosts need not share a disk: a host without the files fetches them first
    (marin/train/stored.py). One process alone is orbax's usual single-process checkpoint.
    """

    def __init__(self, directory: Path, create: bool = True):
        self.directory = Path(directory).resolve()
        self.solo = jax.process_count() > 1
        mp = (ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                 active_processes={jax.process_index()})
              if self.solo else ocp.options.MultiprocessingOptions())
        if self.solo and create:  # orbax creates no folder for a subset of processes
            self.directory.mkdir(parents=True, exist_ok=True)
            create = False
        # Synchronous: a save returns once committed, with no orbax thread left running to fail later.
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=create, multiprocessing_options=mp,
                                               enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(os.fspath(self.directory), options=options,
                                             item_names=("state", "meta"))
        _REPORTS.open()

    def steps(self) -> list[int]:
        """Committed steps only."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Save, and return once orbax has committed the step (orbax saves synchronously here). On a
        failing disk (full, quota, I/O error) a WriteError names the step's folder: orbax's uncommitted
        folder is removed, earlier steps are kept, and what orbax's threads report about the failure
        is dropped (one line)."""
        _REPORTS.saving = True
        try:
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
            self.manager.wait_until_finished()
        except Exception as e:
            cause = fsutil.failure_cause(e)
            _REPORTS.done(failed_on_disk=cause is not None)
            if cause is None:
                raise
            _remove_uncommitted(self.directory, step)
            raise fsutil.WriteError(self.path(step), cause) from None
        _REPORTS.done(failed_on_disk=False)

    def restore(self, step: int, abstract: Any, shardings: Any) -> tuple[Any, dict[str, Any]]:
        """Restore into the abstract TrainState with the given shardings."""
        if self.solo:
            host, meta = self.restore_host(step, abstract)
            return placed(host, shardings), meta
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, shardings)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def restore_host(self, step: int, abstract: Any) -> tuple[Any, dict[str, Any]]:
        """Restore as host (numpy) arrays, by this process alone."""
        target = jax.tree.map(lambda x: np.empty(x.shape, x.dtype), abstract)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
        _REPORTS.close()
