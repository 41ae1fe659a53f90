"""Checkpoints on the project's DVC remote, for hosts that share no disk.

On cloud TPU and GPU VMs every host has its own disk, and checkpoints live in object storage (as
Levanter's and Marin's do). With ``MARIN_CHECKPOINT_REMOTE=<remote>`` (a DVC remote of the project,
or ``default``) process 0 stores each committed checkpoint there as ``marin publish`` stores one:
every file under its sha256, then a manifest naming them, last; the ``checkpoint`` record says
where (``stored``). A process that resumes, or a ``marin verify`` elsewhere, and lacks a recorded
checkpoint fetches it from there, every file checked. The variable is how a run is executed, never
its recipe: a replay stores nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from marin.errors import StageError
from marin.ledger.bodies import StoredCheckpoint
from marin.remote import Remote, RemoteError, error_line, fetch_checkpoint, open_remote, open_repo, put_checkpoint

ENV = "MARIN_CHECKPOINT_REMOTE"


def configured(environ: dict[str, str] | None = None) -> str | None:
    """The remote named by MARIN_CHECKPOINT_REMOTE (``default``: the project's default one), or None."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    return value or None


class Store:
    """Process 0's handle on the remote for one training run: opened once, closed at the end."""

    def __init__(self, root: Path, name: str, stage: str = "train") -> None:
        self.root, self.stage = root, stage
        self.repo: Any = open_repo(root)
        try:
            self.remote: Remote = open_remote(self.repo, None if name == "default" else name)
        except RemoteError as e:
            self.repo.close()
            raise StageError(f"{ENV}={name}: {e}") from None

    def put(self, run_id: str, step: int, digest: str, path: str) -> StoredCheckpoint:
        """Store the committed checkpoint at ``path`` (project-relative); a failure is one line, and
        the checkpoint is not recorded, so the one before it stays the resume point."""
        try:
            put = put_checkpoint(self.remote, run_id, step, digest, path, self.root / path)
        except Exception as e:
            raise StageError(f"checkpoint {step} of {run_id} could not be stored in DVC remote {self.remote.name} "
                             f"({self.remote.url}): {error_line(e)}; it is not recorded, and the run stays unfinished "
                             "with the checkpoint before it as the resume point: fix the remote and rerun the stage "
                             "(on every host) to resume") from None
        return {"remote": self.remote.name, "url": put.url, "manifest": put.manifest}

    def close(self) -> None:
        self.repo.close()


def fetch(root: Path, run_id: str, step: int, digest: str, stored: StoredCheckpoint, dest: Path) -> None:
    """The stored checkpoint ``step`` of ``run_id`` into ``dest``, whole or not at all; one line if not."""
    where = f"checkpoint {step} of {run_id} (stored in DVC remote {stored['remote']}, {stored['url']})"
    try:
        with open_repo(root) as repo:
            remote = open_remote(repo, stored["remote"])
            fetch_checkpoint(remote, {"run_id": run_id, "step": step, "digest": digest,
                                      "manifest": stored["manifest"], "url": stored["url"]}, dest)
    except RemoteError as e:
        raise StageError(f"{where}: {e}") from None
