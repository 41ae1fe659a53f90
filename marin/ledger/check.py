"""``marin ledger check``: schema, chain, Merkle root, outputs on disk, dvc.lock.

Each check is a numbered step with its own message; every failure names the run file,
the record seq and what differs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marin import hashing
from marin.ledger import merkle
from marin.ledger.records import AFTER_FINISH, Record
from marin.ledger.store import RunLog, read_all
from marin.paths import ledger_dir


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

    @property
    def ok(self) -> bool:
        return not self.problems


def check_run(log: RunLog) -> list[Problem]:
    """Steps 1-4 for one run file: lines parse and match their schemas, seq/prev/digest
    chain, run.started first and run.finished last (only verification records may follow it),
    Merkle root."""
    name = log.path.name
    out = [Problem(*p.split(": ", 1)) for p in log.problems]  # 1. schema / JSON per line
    if log.truncated is not None:
        n = len(log.records) + len(log.problems) + 1
        out.append(Problem(
            f"{name} line {n}",
            f"truncated last line ({len(log.truncated)} bytes, a crash mid-write); the "
            f"{len(log.records)} records before it are intact; `marin ledger repair {log.run_id}` sets it aside",
        ))
    prev: Record | None = None
    for i, r in enumerate(log.records):  # 2. chain
        where = f"{name} seq {r.seq}"
        if r.run_id != log.run_id:
            out.append(Problem(where, f"run_id {r.run_id!r} does not match the file name"))
        if r.seq != i and (prev is None or r.seq != prev.seq + 1):
            expected = 0 if prev is None else prev.seq + 1
            out.append(Problem(where, f"seq {r.seq} where {expected} was expected: "
                                      "a record is missing or out of order"))
        recomputed = Record.compute_digest(r.to_dict())
        if recomputed != r.digest:
            out.append(Problem(where, f"record digest mismatch: recorded {r.digest}, "
                                      f"content hashes to {recomputed} (record edited)"))
        expected_prev = None if prev is None else prev.digest
        if r.prev != expected_prev:
            out.append(Problem(where, f"chain broken: prev is {r.prev}, "
                                      f"the previous record's digest is {expected_prev}"))
        prev = r
    if log.records and log.records[0].kind != "run.started":  # 3. shape of a run
        out.append(Problem(f"{name} seq {log.records[0].seq}", "first record is not run.started"))
    fin = log.finished
    for r in log.records:
        if r.kind == "run.finished" and r is not fin:
            out.append(Problem(f"{name} seq {r.seq}", "run.finished is followed by records other than "
                                                      "verifications"))
        if r.kind in AFTER_FINISH and (fin is None or r.seq < fin.seq):
            out.append(Problem(f"{name} seq {r.seq}", f"a {r.kind} record before run.finished"))
    if fin is not None:  # 4. Merkle root
        n = fin.body["records"]
        leaves = [hashing.parse(r.digest) for r in log.records[: log.records.index(fin)]]
        if n != len(leaves):
            out.append(Problem(f"{name} seq {fin.seq}",
                               f"run.finished covers {n} records but {len(leaves)} precede it"))
        root = hashing.fmt(merkle.merkle_root(leaves[:n]))
        if root != fin.body["merkle_root"]:
            out.append(Problem(f"{name} seq {fin.seq}",
                               f"Merkle root mismatch: recorded {fin.body['merkle_root']}, records hash to {root}"))
    return out


def _dvc_lock_outs(root: Path) -> dict[str, str]:
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    data = yaml.safe_load(lock.read_text()) or {}
    outs = {}
    for stage in (data.get("stages") or {}).values():
        for o in stage.get("outs") or []:
            if "md5" in o:
                outs[Path(o["path"]).as_posix()] = o["md5"]
    return outs


def check_outputs(root: Path, logs: list[RunLog], report: Report) -> list[Problem]:
    """Steps 5-6: every recorded output still on disk has a recorded digest (the latest
    run's, or an older run's when DVC checked out an older version), and dvc.lock's md5
    for it was recorded beside our sha256."""
    by_path: dict[str, list[tuple[RunLog, Record]]] = defaultdict(list)
    for log in logs:
        for r in log.of_kind("output"):
            by_path[r.body["path"]].append((log, r))
    problems = []
    for path, recs in sorted(by_path.items()):
        p = root / path
        if not p.exists():
            continue
        report.outputs_checked += 1
        digest = hashing.path_digest(p)
        matching = [(log, r) for log, r in recs if r.body["digest"] == digest]
        log, last = recs[-1]
        if not matching:
            problems.append(Problem(
                path,
                f"on disk it hashes to {digest}, which no run recorded; last recorded by "
                f"{log.path.name} seq {last.seq} as {last.body['digest']} (changed after it was recorded)",
            ))
            if "entries" in last.body:
                problems.extend(_entry_diff(p, path, log, last))
        elif matching[-1][1] is not last:
            report.notes.append(f"{path}: an older version is on disk (from {matching[-1][0].run_id})")
    for path, md5 in sorted(_dvc_lock_outs(root).items()):
        recs = by_path.get(path)
        if recs and not any(r.body.get("dvc_md5") == md5 for _, r in recs):
            log, last = recs[-1]
            problems.append(Problem(
                f"dvc.lock {path}",
                f"md5 {md5} matches no ledger output for this path (last: {log.path.name} seq "
                f"{last.seq} recorded dvc md5 {last.body.get('dvc_md5')})",
            ))
    return problems


def entry_changes(p: Path, entries: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    """Files inside directory ``p`` that differ from recorded ``entries``: (path, recorded, on disk)."""
    recorded = {e["path"]: e["digest"] for e in entries}
    now = {rel: d for rel, d, _ in hashing.dir_entries(p)}
    return [(rel, recorded.get(rel), now.get(rel)) for rel in sorted(set(recorded) | set(now))
            if recorded.get(rel) != now.get(rel)]


def _entry_diff(p: Path, path: str, log: RunLog, rec: Record) -> list[Problem]:
    """Name the files inside a directory output that differ from its recorded entries."""
    out = []
    for rel, recorded, now in entry_changes(p, rec.body["entries"]):
        where = f"{path}/{rel}"
        if now is None:
            out.append(Problem(where, f"missing; recorded by {log.path.name} seq {rec.seq}"))
        elif recorded is None:
            out.append(Problem(where, f"not recorded by {log.path.name} seq {rec.seq} (file added)"))
        else:
            out.append(Problem(where, f"on disk it hashes to {now}; {log.path.name} seq {rec.seq} "
                                      f"recorded {recorded} (file changed)"))
    return out


def check(root: Path) -> Report:
    """Check the whole ledger of the project at ``root``."""
    logs = read_all(ledger_dir(root))
    report = Report(runs=len(logs), records=sum(len(log.records) for log in logs))
    for log in logs:
        report.problems.extend(check_run(log))
    report.problems.extend(check_outputs(root, logs, report))
    return report
