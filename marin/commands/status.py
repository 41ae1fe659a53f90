"""``marin status``: which outputs were made by code that is no longer the code of their stage.

For each declared stage (:mod:`marin.stages`), the run that produced the output now recorded
in ``dvc.lock`` (its md5 matched against the runs' output records; else the stage's latest
succeeded run) recorded its code closure file by file (``run.started.code.closure``). The
stage's closure now is computed from the imports (:mod:`marin.stages.closure`); a file whose digest
differs, a module the stage imports now and did not then, or one it no longer imports makes
the output **stale**, even where ``dvc.yaml`` and so DVC would not notice.

It also names what a git merge can leave that no run made (:func:`workspace`): an output on
disk that is not the one ``dvc.lock`` names (with the run that produced each, from the ledger),
and params of a stage that no succeeded run of it used together (two branches each changed one),
and a stage whose producing run read an input that is not the version on disk (an evaluation of
the previous model beside the merged one, or of a model no longer on disk: :func:`changed_inputs`,
which makes the stage stale).
The temporary folders a killed run left are listed too (:func:`marin.ledger.check.leftovers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import config, hashing, stages
from marin.ledger.hash_cache import HashCache
from marin.ledger.index import Index
from marin.ledger.store import read_started
from marin.stages import dvcfiles

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
    inputs: list[str] = field(default_factory=list)  # inputs the run read, not the version on disk now
    missing: list[str] = field(default_factory=list)  # inputs the run read, on disk no more

    @property
    def stale(self) -> bool:
        return bool(self.changed or self.added or self.removed or self.whole_code_changed or self.inputs
                    or self.missing)

    def line(self) -> str:
        outs = ", ".join(self.outputs) or "its outputs"
        if self.run_id is None:
            return f"never run: {self.stage} (no succeeded run in the ledger)"
        if not self.stale:
            return f"up to date: {self.stage} ({outs}, run {self.run_id})"
        if self.whole_code_changed and not self.inputs and not self.missing:
            what = "the code changed (the run recorded no per-file closure)"
        else:
            parts = [f"input {p} is missing" for p in self.missing] + \
                    [f"{p} is not the version the run read" for p in self.inputs] + \
                    [f"{p} changed" for p in self.changed] + [f"{p} now imported" for p in self.added] + \
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


def compare(root: Path, stage: str, code: Mapping[str, Any]) -> StageStatus:
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
    locks, hashes = dvcfiles.lock_outs(root), HashCache(root, index=index)
    out = []
    for s in stages.declared(root):
        locked = locks.get(s.name, {})
        run_id = producing_run(index, s.name, locked)
        if run_id is None:
            out.append(StageStatus(s.name, None))
            continue
        started = read_started(root, run_id)
        st = compare(root, s.name, started.body_as("run.started")["code"])
        st.run_id, st.outputs = run_id, sorted(locked) or [o.path for o in s.outs]
        st.inputs, st.missing = changed_inputs(root, index, run_id, hashes)
        out.append(st)
    return out


def changed_inputs(root: Path, index: Index, run_id: str, hashes: Any) -> tuple[list[str], list[str]]:
    """(changed, missing): the inputs run ``run_id`` read whose bytes on disk are now another version
    (a merge keeps an evaluation of the previous model beside the merged model, and the code alone
    called it up to date), and those no longer on disk (an evaluation of a model since removed is not
    up to date either). Digests come through the index's hash cache: unchanged files are not read again."""
    changed, missing = [], []
    for _, _, _, body in index.entities(run_id=run_id, role="input"):
        path = body.get("path")
        if body.get("digest_of") or not path:
            continue  # a ledger head or key, not a file's bytes
        if not (root / path).exists():
            missing.append(path)
        elif hashing.digest_path(root / path, hashes).digest != body.get("digest"):
            changed.append(path)
    return sorted(set(changed)), sorted(set(missing))


def _made_by(index: Index, path: str, key: str, value: str) -> str:
    """The run whose output record for ``path`` has ``key`` (``dvc_md5``, ``digest``) = ``value``."""
    found = [r for r, _, _, body in index.entities(path=path, role="output") if body.get(key) == value]
    return f"run {found[-1]}" if found else "no recorded run"


def lock_differences(root: Path, index: Index) -> list[str]:
    """One line per output whose bytes on disk are not the version ``dvc.lock`` names, with the run
    that produced each (a merge takes one branch's dvc.lock, the workspace keeps the other's output)."""
    hashes, out = HashCache(root, index=index), []
    for stage, locked in dvcfiles.lock_outs(root).items():
        for path, md5 in sorted(locked.items()):
            if not (root / path).exists():
                continue  # missing: `ledger check` names it
            disk = hashing.digest_path(root / path, hashes)
            if disk.dvc_md5 != md5:
                out.append(f"differs: {stage} ({path}): dvc.lock names the output of "
                           f"{_made_by(index, path, 'dvc_md5', md5)}, the one on disk is of "
                           f"{_made_by(index, path, 'digest', disk.digest)}; `dvc checkout {stage}` puts "
                           f"dvc.lock's in place, `dvc repro {stage}` makes one for the params now")
    return out


def _declared(raw: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The flattened values of the params ``keys`` (sections or dotted keys) that a stage declares."""
    out: dict[str, Any] = {}
    for key in keys:
        value: Any = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out.update(config.flatten(value, key))
    return out


def unmatched_params(root: Path, index: Index) -> list[str]:
    """One line per stage whose declared params, as params.yaml has them now, are those of no
    succeeded run of it in the ledger, naming the closest run and where it differs."""
    raw, out = config.load(root / "params.yaml").raw, []
    for s in stages.declared(root):
        now = _declared(raw, s.params)
        done = [r.run_id for r in index.runs(s.name) if r.status == "succeeded"]
        if not now or not done:
            continue
        diffs = []
        for run_id in reversed(done):  # newest first: of equally close runs, the latest is named
            recorded = config.flatten(read_started(root, run_id).body_as("run.started")["params"])
            diffs.append((sorted(k for k in now if recorded.get(k, _NONE) != now[k]), run_id, recorded))
        diffs.sort(key=lambda d: len(d[0]))  # stable: closest first
        if diffs[0][0]:
            keys = sorted({k for differ, _, _ in diffs[:2] for k in differ})[:SHOWN]
            closest = "; ".join(f"run {run_id} had " + ", ".join(f"{k} {recorded.get(k, 'unset')!r}"
                                                                 for k in differ[:SHOWN])
                                for differ, run_id, recorded in diffs[:2])
            out.append(f"params match no run: {s.name}: " + ", ".join(f"{k} {now[k]!r}" for k in keys) +
                       f" in params.yaml were never used together by any of the {len(done)} succeeded "
                       f"{s.name} runs (closest: {closest}); `dvc repro {s.name}` makes one")
    return out


_NONE = object()


def workspace(root: Path, index: Index) -> list[str]:
    """What no run made: outputs unlike the ones dvc.lock names, params no run used together."""
    return lock_differences(root, index) + unmatched_params(root, index)
