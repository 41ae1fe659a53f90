"""Steps 1-4 of ``marin ledger check`` for one run: its lines parse and match their schemas, the
seq/prev/digest chain holds, run.started comes first and run.finished last, and its Merkle root; each
run fed a record at a time, so a run of any length is checked in O(log n) memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from marin import hashing
from marin.errors import LedgerError, SchemaError
from marin.ledger import clock, merkle
from marin.ledger.records import AFTER_FINISH, Record, content_digest
from marin.ledger.store import RunLog, open_run, run_lines
from marin.schemas import UnpinnedSchema


@dataclass(frozen=True)
class Problem:
    where: str  # run file (and seq) or output path
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


class RunCheck:
    """Steps 1-4 for one run, fed a record at a time (O(log n) memory: the Merkle root is built
    as records arrive): lines parse and match their schemas, seq/prev/digest chain, run.started
    first and run.finished last (only verification records may follow it), Merkle root."""

    def __init__(self, name: str, run_id: str, watch: int | None = None, skew_s: float = math.inf):
        """``skew_s``: ``ledger.clock_skew_s`` (inf: no clock check, as for one run read by :func:`check_run`)."""
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


def stream_run(path: Path, skew_s: float, watch: int | None = None) -> RunCheck:
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


def _is(value: object, kind: type) -> bool:
    """``isinstance`` of a value whose declared type an unvalidated record need not have."""
    return isinstance(value, kind)


def _unvalidated(line: bytes, where: str) -> Record:
    """A record parsed without its (edited) schema, if it has what the chain and output checks read."""
    r = Record.from_line(line, where, validate=False)
    try:
        hashing.parse(r.digest)
        # unvalidated: seq and body hold whatever JSON the line has, whatever Record declares
        shaped = (_is(r.seq, int) and _is(r.body, dict)
                  and all(isinstance(r.body.get(k), str | int) for k in _USED.get(r.kind, ())))
    except (ValueError, TypeError, AttributeError):
        shaped = False
    if not shaped:
        raise SchemaError(f"{where}: not a record (seq, digest or body unreadable; its schema is edited, so "
                          "nothing more was checked)")
    return r
