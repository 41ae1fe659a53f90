"""``marin status``: which outputs were made by code that is no longer the code of their stage.

For each declared stage (:mod:`marin.stages`), the run that produced the output now recorded
in ``dvc.lock`` (its md5 matched against the runs' output records; else the stage's latest
succeeded run) recorded its code closure file by file (``run.started.code.closure``). The
stage's closure now is computed from the imports (:mod:`marin.closure`); a file whose digest
differs, a module the stage imports now and did not then, or one it no longer imports makes
the output **stale**, even where ``dvc.yaml`` and so DVC would not notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import dvcfiles, hashing, stages
from marin.ledger.index import Index
from marin.ledger.store import read_started

SHOWN = 3  # changed files named per stage in the one-line summary


@dataclass
class StageStatus:
    stage: str
    run_id: str | None
    outputs: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # imported now, not by the run
    removed: list[str] = field(default_factory=list)  # imported by the run, not now
    whole_code_changed: bool = False  # a run recorded before closures were: only the code digest

    @property
    def stale(self) -> bool:
        return bool(self.changed or self.added or self.removed or self.whole_code_changed)

    def line(self) -> str:
        outs = ", ".join(self.outputs) or "its outputs"
        if self.run_id is None:
            return f"never run: {self.stage} (no succeeded run in the ledger)"
        if not self.stale:
            return f"up to date: {self.stage} ({outs}, run {self.run_id})"
        if self.whole_code_changed:
            what = "the code changed (the run recorded no per-file closure)"
        else:
            parts = [f"{p} changed" for p in self.changed] + [f"{p} now imported" for p in self.added] + \
                    [f"{p} no longer imported" for p in self.removed]
            more = f" (+{len(parts) - SHOWN} more)" if len(parts) > SHOWN else ""
            what = ", ".join(parts[:SHOWN]) + more
        return (f"stale: {self.stage} ({outs}, run {self.run_id}): {what} since the run; "
                f"`dvc repro {self.stage}` rebuilds it")


def producing_run(index: Index, stage: str, locked: dict[str, str]) -> str | None:
    """The run whose output record matches ``dvc.lock``'s md5 for one of the stage's outputs,
    else the stage's latest succeeded run."""
    for path, md5 in sorted(locked.items()):
        found = [r for r, _, _, body in index.entities(path=path, role="output") if body.get("dvc_md5") == md5]
        if found:
            return found[-1]
    done = [r for r in index.runs(stage) if r.status == "succeeded"]
    return done[-1].run_id if done else None


def compare(root: Path, stage: str, code: dict[str, Any]) -> StageStatus:
    """The stage's closure now against the ``code`` section its run recorded."""
    st = StageStatus(stage, None)
    recorded = code.get("closure")
    now_files = stages.code_files(root, stage)
    if recorded is None:
        st.whole_code_changed = hashing.files_digest(root, now_files) != code.get("code_digest")
        return st
    now = {p: hashing.file_digest(root / p) for p in now_files if (root / p).is_file()}
    st.changed = sorted(p for p in now.keys() & recorded.keys() if now[p] != recorded[p])
    st.added = sorted(now.keys() - recorded.keys())
    st.removed = sorted(recorded.keys() - now.keys())
    return st


def status(root: Path, index: Index) -> list[StageStatus]:
    """One status per declared stage, in pipeline order."""
    locks = dvcfiles.lock_outs(root)
    out = []
    for s in stages.STAGES:
        locked = locks.get(s.name, {})
        run_id = producing_run(index, s.name, locked)
        if run_id is None:
            out.append(StageStatus(s.name, None))
            continue
        started = read_started(root, run_id)
        st = compare(root, s.name, started.body["code"])
        st.run_id, st.outputs = run_id, sorted(locked) or [o.path for o in s.outs]
        out.append(st)
    return out
