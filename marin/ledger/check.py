"""``marin ledger check``: schema, chain, Merkle root (each run: :mod:`marin.ledger.runcheck`), outputs
on disk, dvc.lock, clocks.

Each check is a numbered step with its own message; every failure names the run file,
the record seq and what differs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, schemas
from marin.errors import IntegrityError
from marin.ledger import clock, head, listing
from marin.ledger.hash_cache import HashCache
from marin.ledger.head import Head
from marin.ledger.records import Record
from marin.ledger.runcheck import Problem as Problem
from marin.ledger.runcheck import RunCheck, stream_run
from marin.ledger.runcheck import check_run as check_run
from marin.ledger.store import odd_files, read_run, run_files
from marin.paths import ledger_dir


@dataclass(frozen=True)
class DvcOuts:
    """What the project's DVC files say of its outputs, read by the caller (:mod:`marin.stages.dvcfiles`:
    ``locked``, ``declared_outs``): the ledger reads no pipeline file itself."""

    locked: Mapping[str, str]  # output path -> the md5 dvc.lock records for it
    declared: Mapping[str, bool]  # every output path dvc.yaml declares -> whether DVC caches it


@dataclass
class Report:
    runs: int = 0
    records: int = 0
    outputs_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # recorded outputs the workspace lacks
    leftovers: list[str] = field(default_factory=list)  # temporary folders killed runs left beside outputs

    @property
    def ok(self) -> bool:
        return not self.problems


def _latest_per_stage(runs: list[RunCheck]) -> set[str]:
    """Run ids of the latest succeeded run of each stage: the outputs a workspace should hold."""
    latest: dict[str, str] = {}
    for rc in runs:  # oldest first
        if rc.stage is not None and rc.status == "succeeded":
            latest[rc.stage] = rc.run_id
    return set(latest.values())


def check_outputs(root: Path, dvc: DvcOuts, runs: list[RunCheck], report: Report,
                  hashes: hashing.FileHashes) -> list[Problem]:
    """Steps 5-7: every output on disk that a run recorded has a recorded digest (the latest
    run's, or an older run's that DVC checked out); every output dvc.lock or dvc.yaml names is
    explained by a recorded run; dvc.lock's md5 for it was recorded beside our sha256."""
    by_path: dict[str, list[tuple[RunCheck, Record]]] = defaultdict(list)
    for rc in runs:
        for r in rc.outputs:
            by_path[r.body["path"]].append((rc, r))
    locked, cached = dvc.locked, dvc.declared
    declared = set(cached)
    latest = _latest_per_stage(runs)
    problems: list[Problem] = []
    for path, recs in sorted(by_path.items()):
        p = root / path
        if p.exists():
            problems.extend(_on_disk(root, path, recs, report, hashes))
        elif any(log.run_id in latest for log, _ in recs) and (path in locked or path in declared):
            log, last = recs[-1]
            how = "`dvc checkout` or `dvc pull` restores it" if cached.get(path, True) else \
                "dvc.yaml keeps it out of the DVC cache: commit it with git, or rerun its stage"
            report.missing.append(f"{path}: recorded by {log.name} seq {last.seq}, not on disk ({how})")
    for path in sorted((set(locked) | declared) - set(by_path)):
        if path in locked or (root / path).exists():
            problems.append(Problem(path, f"{'listed in dvc.lock' if path in locked else 'on disk'} but no run in "
                                          "the ledger produced it: was a run file deleted? restore "
                                          "ledger/runs/ from git, or rerun its stage (`dvc repro -f`)"))
    for path, md5 in sorted(locked.items()):
        recs = by_path.get(path)
        matching = [(log, r) for log, r in recs or () if r.body.get("dvc_md5") == md5]
        if recs and not matching:
            log, last = recs[-1]
            problems.append(Problem(
                f"dvc.lock {path}",
                f"md5 {md5} matches no ledger output for this path (last: {log.name} seq "
                f"{last.seq} recorded dvc md5 {last.body.get('dvc_md5')})",
            ))
        elif matching and not any(log.status == "succeeded" for log, _ in matching):
            problems.append(_unfinished_lock(path, matching[-1][0]))
    return problems


def check_checkpoints(root: Path, runs: list[RunCheck], report: Report, hashes: hashing.FileHashes) -> list[Problem]:
    """Step 7c: every checkpoint on disk whose record holds its files' digest still hashes to it (a resume or
    a segment replay restores from these files; one deleted is not a problem: it was pruned or never copied)."""
    problems: list[Problem] = []
    for rc in runs:
        for seq, path, recorded in rc.checkpoints:
            if not (root / path).is_dir():
                continue
            report.outputs_checked += 1
            now = hashing.digest_path(root / path, hashes).digest
            if now != recorded:
                problems.append(Problem(path, f"on disk its files hash to {now}; {rc.name} seq {seq} recorded "
                                              f"{recorded} (checkpoint changed after it was recorded): restore it "
                                              "(`marin publish` keeps a copy by digest) or delete it"))
    return problems


def _unfinished_lock(path: str, log: RunCheck) -> Problem:
    """DVC locks an output only once its stage exits 0, after the run recorded its end: an output dvc.lock
    names whose every recording run has no succeeded run.finished was rolled back (or its end removed)."""
    return Problem(f"dvc.lock {path}", f"locked from {log.name}, whose run is {log.status} in the ledger (its "
                                       "run.finished was removed, or the run failed): restore ledger/runs/ from "
                                       "git, or rerun the stage (`dvc repro -f`)")


def _on_disk(root: Path, path: str, recs: list[tuple[RunCheck, Record]], report: Report,
             hashes: hashing.FileHashes) -> list[Problem]:
    """The bytes at ``path`` must be one of its recorded versions."""
    report.outputs_checked += 1
    digest = hashing.digest_path(root / path, hashes).digest
    matching = [(log, r) for log, r in recs if r.body["digest"] == digest]
    log, last = recs[-1]
    if not matching:
        problems = [Problem(
            path,
            f"on disk it hashes to {digest}, which no run recorded; last recorded by "
            f"{log.name} seq {last.seq} as {last.body['digest']} (changed after it was recorded)",
        )]
        if "entries" in last.body or "listing" in last.body:
            problems.extend(_entry_diff(root, path, log, last))
        return problems
    if matching[-1][1] is not last:
        report.notes.append(f"{path}: an older version is on disk (from {matching[-1][0].run_id})")
    return []


def entry_changes(p: Path, entries: Iterable[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    """Files inside directory ``p`` that differ from recorded ``entries``: (path, recorded, on disk)."""
    recorded = {e["path"]: e["digest"] for e in entries}
    now = {rel: d for rel, d, _ in hashing.dir_entries(p)}
    return [(rel, recorded.get(rel), now.get(rel)) for rel in sorted(set(recorded) | set(now))
            if recorded.get(rel) != now.get(rel)]


def _entry_diff(root: Path, path: str, log: RunCheck, rec: Record) -> list[Problem]:
    """Name the files inside a directory output that differ from its recorded entries."""
    out: list[Problem] = []
    body: dict[str, Any] = rec.body
    if body.get("entries", ()) is None:  # dropped while streaming: read this one record again
        full = read_run(ledger_dir(root) / log.name, validate=False)
        body = next((r.body for r in full.records if r.seq == rec.seq), body | {"entries": list[Any]()})
    try:
        changes = entry_changes(root / path, listing.entries(root, body))
    except IntegrityError as e:
        return [Problem(rec.body.get("listing", path), str(e).split(": ", 1)[-1])]
    for rel, recorded, now in changes:
        where = f"{path}/{rel}"
        if now is None:
            out.append(Problem(where, f"missing; recorded by {log.name} seq {rec.seq}"))
        elif recorded is None:
            out.append(Problem(where, f"not recorded by {log.name} seq {rec.seq} (file added)"))
        else:
            out.append(Problem(where, f"on disk it hashes to {now}; {log.name} seq {rec.seq} "
                                      f"recorded {recorded} (file changed)"))
    return out


def _listings(root: Path, runs: list[RunCheck]) -> list[Problem]:
    """Step 7b: every listing a directory output points to is there and hashes to its digest."""
    out: list[Problem] = []
    for rc in runs:
        for r in rc.outputs:
            if "listing" in r.body:
                try:
                    for _ in listing.entries(root, r.body):
                        pass
                except IntegrityError as e:
                    out.append(Problem(f"{rc.name} seq {r.seq}", str(e)))
    return out


def leftovers(root: Path, declared: Iterable[str]) -> list[str]:
    """One line per temporary file or folder that a killed run left beside a declared output (``declared``:
    :attr:`DvcOuts.declared`) or a ledger listing, and that no live run holds: the next run of the stage removes it."""
    folders = {(root / p).parent for p in declared} | {root / listing.LISTINGS}
    out: list[str] = []
    for d in sorted(folders):
        for p in fsutil.leftovers(d):
            out.append(f"{p.relative_to(root).as_posix()} ({hashing.path_size(p):,} bytes): left by a killed run; "
                       "the next run of the stage that writes beside it removes it, or delete it")
    return out


def check(root: Path, dvc: DvcOuts, skew_s: float, since: Head | None = None, rehash: bool = False) -> Report:
    """Check the whole ledger of the project at ``root`` against its DVC files' outputs ``dvc`` (and that it
    only grew since ``since``), one run file at a time; output files are re-read only when their inode, size
    or times changed since they were last hashed (``rehash`` reads them all). ``skew_s``: the clock skew
    allowed (``ledger.clock_skew_s``)."""
    pinned = schemas.pin_problems()  # 0. the schemas that judge the records are the released ones
    watch = {leaf.run_id: leaf.seq for leaf in since.leaves} if since is not None else {}
    runs = [stream_run(path, skew_s, watch.get(path.name.removesuffix(".jsonl")))
            for path in run_files(ledger_dir(root))]
    runs.sort(key=lambda rc: (rc.started_time, rc.run_id))  # oldest first
    report = Report(runs=len(runs), records=sum(rc.records for rc in runs))
    report.problems.extend(Problem(*p.split(": ", 1)) for p in pinned)
    if unvalidated := sum(rc.unvalidated for rc in runs):
        report.notes.append(f"{unvalidated} records were not checked against their (edited) schemas; "
                            "their chain, digests and Merkle roots were")
    report.problems.extend(Problem(p.relative_to(root).as_posix(), f"{why}, not a run file: no reader opens it; "
                                   "move it out of ledger/runs/ (a run file is a regular file)")
                           for p, why in odd_files(ledger_dir(root)))
    for rc in runs:
        report.problems.extend(rc.close())
    report.problems.extend(_listings(root, runs))
    with HashCache(root, rehash) as hashes:
        report.problems.extend(check_outputs(root, dvc, runs, report, hashes))
        report.problems.extend(check_checkpoints(root, runs, report, hashes))
    report.leftovers = leftovers(root, dvc.declared)
    if since is not None:  # 8. nothing in the snapshot was deleted, rolled back or rewritten
        found = {rc.run_id: (rc.last_seq, rc.watched) for rc in runs}
        report.problems.extend(Problem(where, what) for where, what in head.since(since, found))
        known = {leaf.run_id for leaf in since.leaves}  # 8b. and nothing was added to it backdated
        at = clock.head_time(since.time, [rc.watched_time for rc in runs if rc.watched_time])
        report.problems.extend(Problem(w, what) for w, what in clock.backdated(at, known, runs, skew_s))
    report.problems.extend(Problem(where, what) for where, what in clock.check_chain(runs, skew_s))  # 9. clocks
    return report
