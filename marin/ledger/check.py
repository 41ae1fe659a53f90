"""``marin ledger check``: schema, chain, Merkle root, outputs on disk, dvc.lock, clocks.

Each check is a numbered step with its own message; every failure names the run file,
the record seq and what differs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, schemas
from marin.errors import IntegrityError, LedgerError, SchemaError
from marin.ledger import clock, head, listing, merkle
from marin.ledger.hash_cache import hash_cache
from marin.ledger.head import Head
from marin.ledger.records import AFTER_FINISH, Record, content_digest
from marin.ledger.store import RunLog, odd_files, open_run, read_run, run_files, run_lines
from marin.paths import ledger_dir
from marin.schemas import UnpinnedSchema
from marin.stages import dvcfiles


@dataclass(frozen=True)
class Problem:
    where: str  # run file (and seq) or output path
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


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


class RunCheck:
    """Steps 1-4 for one run, fed a record at a time (O(log n) memory: the Merkle root is built
    as records arrive): lines parse and match their schemas, seq/prev/digest chain, run.started
    first and run.finished last (only verification records may follow it), Merkle root."""

    def __init__(self, name: str, run_id: str, watch: int | None = None, skew_s: float = clock.SKEW_S):
        self.name, self.run_id = name, run_id
        self.watch, self.watched, self.watched_time = watch, None, ""  # the record at seq ``watch`` (for --since)
        self.clock = clock.Clock(skew_s, since_seq=-1 if watch is None else watch)
        self.last_seq: int | None = None
        self.problems: list[Problem] = []
        self.records = 0
        self.stage: str | None = None  # of run.started, and its time: all a check keeps of it
        self.started_time = ""
        self.finished: tuple[int, str] | None = None  # (seq, status) of the closing run.finished
        self.outputs: list[Record] = []  # output records, their (long) entry lists dropped
        self.checkpoints: list[tuple[int, str, str]] = []  # (seq, path, files digest) of checkpoint records
        self._prev: tuple[int, str] | None = None  # (seq, digest) of the previous record
        self._merkle = merkle.Builder()
        self._root_problem: Problem | None = None
        self.unvalidated = 0  # records parsed without their schema (it is edited)

    def bad_line(self, problem: str) -> None:  # 1. JSON, canonical form, schema
        self.problems.append(Problem(*problem.split(": ", 1)))

    def truncated(self, nbytes: int) -> None:
        n = self.records + len(self.problems) + 1
        self.problems.append(Problem(
            f"{self.name} line {n}",
            f"truncated last line ({nbytes} bytes, a crash mid-write); the {self.records} records before it "
            f"are intact; `marin ledger repair {self.run_id}` sets it aside"))

    def feed(self, r: Record, content_digest: str) -> None:
        """One parsed record and the digest its content hashes to."""
        prev = self._prev
        if r.run_id != self.run_id:  # 2. chain
            self._problem(r, f"run_id {r.run_id!r} does not match the file name")
        if r.seq != self.records and (prev is None or r.seq != prev[0] + 1):
            expected = 0 if prev is None else prev[0] + 1
            self._problem(r, f"seq {r.seq} where {expected} was expected: a record is missing or out of order")
        if content_digest != r.digest:
            self._problem(r, f"record digest mismatch: recorded {r.digest}, "
                             f"content hashes to {content_digest} (record edited)")
        expected_prev = None if prev is None else prev[1]
        if r.prev != expected_prev:
            self._problem(r, f"chain broken: prev is {r.prev}, the previous record's digest is {expected_prev}")
        self._shape(r)
        self._merkle.append(hashing.parse(r.digest))
        self._prev, self.records, self.last_seq = (r.seq, r.digest), self.records + 1, r.seq
        self.clock.feed(r)
        if r.seq == self.watch:
            self.watched, self.watched_time = r.digest, r.time
        if r.kind == "checkpoint" and "files_digest" in r.body:
            self.checkpoints.append((r.seq, r.body["path"], r.body["files_digest"]))
        if r.kind == "output":  # kept for the output checks; entries are re-read if a file differs
            body = {**r.body, "entries": None} if "entries" in r.body else r.body
            self.outputs.append(Record(r.schema, r.run_id, r.seq, r.prev, r.time, r.kind, body, r.digest))

    def _problem(self, r: Record, what: str) -> None:
        self.problems.append(Problem(f"{self.name} seq {r.seq}", what))

    def _shape(self, r: Record) -> None:
        """3. run.started first, run.finished last but for verifications; 4. the Merkle root."""
        if self.records and self.finished is None and r.kind not in AFTER_FINISH and r.kind != "run.finished":
            return  # a record amid the run: nothing of this step to check
        where = f"{self.name} seq {r.seq}"
        if self.records == 0:
            if r.kind == "run.started":
                self.stage, self.started_time = r.body["stage"], r.time
            else:
                self.problems.append(Problem(where, "first record is not run.started"))
        if self.finished is not None and r.kind not in AFTER_FINISH:
            self.problems.append(Problem(f"{self.name} seq {self.finished[0]}",
                                         "run.finished is followed by records other than verifications"))
            self.finished, self._root_problem = None, None
        if r.kind in AFTER_FINISH and self.finished is None:
            self.problems.append(Problem(where, f"a {r.kind} record before run.finished"))
        if r.kind == "run.finished":
            self.finished, self._root_problem = (r.seq, r.body["status"]), None
            n, size = r.body["records"], self._merkle.size
            root = hashing.fmt(self._merkle.root())
            if n != size:
                self._root_problem = Problem(where, f"run.finished covers {n} records but {size} precede it")
            elif root != r.body["merkle_root"]:
                self._root_problem = Problem(where, f"Merkle root mismatch: recorded {r.body['merkle_root']}, "
                                                    f"records hash to {root}")

    @property
    def status(self) -> str:
        return self.finished[1] if self.finished is not None else "unfinished"

    def close(self) -> list[Problem]:
        return self.problems + ([self._root_problem] if self._root_problem else [])


def check_run(log: RunLog) -> list[Problem]:
    """Steps 1-4 for a run already read into memory (verify and report check one run each)."""
    rc = RunCheck(log.path.name, log.run_id)
    for p in log.problems:
        rc.bad_line(p)
    for r in log.records:
        rc.feed(r, Record.compute_digest(r.to_dict()))
    if log.truncated is not None:
        rc.truncated(len(log.truncated))
    return rc.close()


def stream_run(path: Path, watch: int | None = None, skew_s: float = clock.SKEW_S) -> RunCheck:
    """Steps 1-4 for one run file, read a line at a time: each line parsed, checked for its
    canonical form and validated once. A record whose schema is edited (reported by step 0)
    is parsed without it, so the chain, digests and Merkle root are still checked."""
    name = path.name
    rc = RunCheck(name, name.removesuffix(".jsonl"), watch, skew_s)
    try:
        with open_run(path) as f:
            for i, line in enumerate(run_lines(f, path), start=1):
                if not line.endswith(b"\n"):
                    rc.truncated(len(line))
                    break
                _feed(rc, line, f"{name} line {i}")
    except LedgerError as e:  # over a cap: named as the run's problem, the rest of the file unread
        rc.bad_line(str(e))
    return rc


def _feed(rc: RunCheck, line: bytes, where: str) -> None:
    try:
        try:
            rec = Record.from_line(line, where)
        except UnpinnedSchema:
            rec = _unvalidated(line, where)
            rc.unvalidated += 1
    except SchemaError as e:
        rc.bad_line(str(e))
        return
    rc.feed(rec, content_digest(line))


_USED = {"run.started": ("stage",), "run.finished": ("status", "records", "merkle_root"), "output": ("path", "digest")}


def _unvalidated(line: bytes, where: str) -> Record:
    """A record parsed without its (edited) schema, if it has what the chain and output checks read."""
    r = Record.from_line(line, where, validate=False)
    try:
        hashing.parse(r.digest)
        # unvalidated: seq and body hold whatever JSON the line has, whatever Record declares
        shaped = (isinstance(r.seq, int)  # pyright: ignore[reportUnnecessaryIsInstance]
                  and isinstance(r.body, dict)  # pyright: ignore[reportUnnecessaryIsInstance]
                  and all(isinstance(r.body.get(k), str | int) for k in _USED.get(r.kind, ())))
    except (ValueError, TypeError, AttributeError):
        shaped = False
    if not shaped:
        raise SchemaError(f"{where}: not a record (seq, digest or body unreadable; its schema is edited, so "
                          "nothing more was checked)")
    return r


def _latest_per_stage(runs: list[RunCheck]) -> set[str]:
    """Run ids of the latest succeeded run of each stage: the outputs a workspace should hold."""
    latest: dict[str, str] = {}
    for rc in runs:  # oldest first
        if rc.stage is not None and rc.status == "succeeded":
            latest[rc.stage] = rc.run_id
    return set(latest.values())


def check_outputs(root: Path, runs: list[RunCheck], report: Report, hashes: hashing.FileHashes) -> list[Problem]:
    """Steps 5-7: every output on disk that a run recorded has a recorded digest (the latest
    run's, or an older run's that DVC checked out); every output dvc.lock or dvc.yaml names is
    explained by a recorded run; dvc.lock's md5 for it was recorded beside our sha256."""
    by_path: dict[str, list[tuple[RunCheck, Record]]] = defaultdict(list)
    for rc in runs:
        for r in rc.outputs:
            by_path[r.body["path"]].append((rc, r))
    locked = {p: md5 for outs in dvcfiles.lock_outs(root).values() for p, md5 in outs.items()}
    cached = dvcfiles.declared_outs(root)
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


def leftovers(root: Path) -> list[str]:
    """One line per temporary file or folder that a killed run left beside a declared output (or a
    ledger listing) and no live run holds: the next run of the stage removes it."""
    folders = {(root / p).parent for p in dvcfiles.declared_outs(root)} | {root / listing.LISTINGS}
    out: list[str] = []
    for d in sorted(folders):
        for p in fsutil.leftovers(d):
            out.append(f"{p.relative_to(root).as_posix()} ({hashing.path_size(p):,} bytes): left by a killed run; "
                       "the next run of the stage that writes beside it removes it, or delete it")
    return out


def check(root: Path, since: Head | None = None, rehash: bool = False, skew_s: float | None = None) -> Report:
    """Check the whole ledger of the project at ``root`` (and that it only grew since ``since``),
    one run file at a time; output files are re-read only when their inode, size or times
    changed since they were last hashed (``rehash`` reads them all). ``skew_s``: the clock skew
    allowed (None: params.yaml's ``ledger.clock_skew_s``)."""
    pinned = schemas.pin_problems()  # 0. the schemas that judge the records are the released ones
    skew_s = clock.skew_of(root) if skew_s is None else skew_s
    watch = {leaf.run_id: leaf.seq for leaf in since.leaves} if since is not None else {}
    runs = [stream_run(path, watch.get(path.name.removesuffix(".jsonl")), skew_s)
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
    hashes = hash_cache(root, rehash)
    report.problems.extend(check_outputs(root, runs, report, hashes))
    report.problems.extend(check_checkpoints(root, runs, report, hashes))
    report.leftovers = leftovers(root)
    if since is not None:  # 8. nothing in the snapshot was deleted, rolled back or rewritten
        found = {rc.run_id: (rc.last_seq, rc.watched) for rc in runs}
        report.problems.extend(Problem(where, what) for where, what in head.since(since, found))
        known = {leaf.run_id for leaf in since.leaves}  # 8b. and nothing was added to it backdated
        at = clock.head_time(since.time, [rc.watched_time for rc in runs if rc.watched_time])
        report.problems.extend(Problem(w, what) for w, what in clock.backdated(at, known, runs, skew_s))
    report.problems.extend(Problem(where, what) for where, what in clock.check_chain(runs, skew_s))  # 9. clocks
    return report
