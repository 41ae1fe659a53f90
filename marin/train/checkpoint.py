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

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from marin import hashing
from marin.train import distributed


def tensors(state: Any) -> dict[str, np.ndarray]:
    """Every leaf of a pytree as a host array, by its pytree path (``jax.tree_util.keystr``)."""
    return {jax.tree_util.keystr(path): distributed.host_array(leaf)  # gathered across processes if sharded
            for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}


def state_digest(state: Any) -> str:
    """sha256 over (leaf path, dtype, shape, bytes) of every leaf of a pytree."""
    return hashing.tree_digest(tensors(state))


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
        """Save and block until orbax has committed the step."""
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract: Any, shardings: Any) -> tuple[Any, dict[str, Any]]:
        """Restore into the abstract TrainState with the given shardings."""
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, shardings)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
