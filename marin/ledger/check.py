"""``marin ledger check``: schema, chain, Merkle root, outputs on disk, dvc.lock.

Each check is a numbered step with its own message; every failure names the run file,
the record seq and what differs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marin import hashing
from marin.errors import LedgerError, MarinError
from marin.ledger import head, merkle
from marin.ledger.head import Head
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
    missing: list[str] = field(default_factory=list)  # recorded outputs the workspace lacks

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
    """Output path -> md5 of every output ``dvc.lock`` lists."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    try:
        data = yaml.safe_load(lock.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise LedgerError(f"{lock}: not readable YAML ({e}); restore it from git") from None
    outs = {}
    for stage in (data.get("stages") or {}).values():
        for o in stage.get("outs") or []:
            if "md5" in o:
                outs[Path(o["path"]).as_posix()] = o["md5"]
    return outs


def _dvc_yaml_outs(root: Path) -> set[str]:
    """Every output path ``dvc.yaml`` declares (outs, metrics, plots), ``${…}`` resolved from params."""
    spec = root / "dvc.yaml"
    if not spec.is_file():
        return set()
    try:
        data = yaml.safe_load(spec.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise LedgerError(f"{spec}: not readable YAML ({e}); restore it from git") from None
    paths = set()
    for stage in (data.get("stages") or {}).values():
        for key in ("outs", "metrics", "plots"):
            for o in stage.get(key) or []:
                paths.add(next(iter(o)) if isinstance(o, dict) else str(o))
    resolved = {_interpolate(root, p) for p in paths}
    return {Path(p).as_posix() for p in resolved if p is not None}


def _interpolate(root: Path, path: str) -> str | None:
    """``reports/${report.model_name}`` with the value from the validated params (None if unknown)."""
    if "${" not in path:
        return path
    from marin import config

    try:
        raw = config.load(root / "params.yaml").raw
    except MarinError:
        return None

    def value(m: re.Match[str]) -> str:
        v: Any = raw
        for part in m.group(1).split("."):
            v = v[part]
        return str(v)

    try:
        return re.sub(r"\$\{([^}]+)\}", value, path)
    except (KeyError, TypeError):
        return None


def _latest_per_stage(logs: list[RunLog]) -> set[str]:
    """Run ids of the latest succeeded run of each stage: the outputs a workspace should hold."""
    latest: dict[str, str] = {}
    for log in logs:  # oldest first
        if log.started is not None and log.status == "succeeded":
            latest[log.started.body["stage"]] = log.run_id
    return set(latest.values())


def check_outputs(root: Path, logs: list[RunLog], report: Report) -> list[Problem]:
    """Steps 5-7: every output on disk that a run recorded has a recorded digest (the latest
    run's, or an older run's that DVC checked out); every output dvc.lock or dvc.yaml names is
    explained by a recorded run; dvc.lock's md5 for it was recorded beside our sha256."""
    by_path: dict[str, list[tuple[RunLog, Record]]] = defaultdict(list)
    for log in logs:
        for r in log.of_kind("output"):
            by_path[r.body["path"]].append((log, r))
    locked, declared = _dvc_lock_outs(root), _dvc_yaml_outs(root)
    latest = _latest_per_stage(logs)
    problems = []
    for path, recs in sorted(by_path.items()):
        p = root / path
        if p.exists():
            problems.extend(_on_disk(root, path, recs, report))
        elif any(log.run_id in latest for log, _ in recs) and (path in locked or path in declared):
            log, last = recs[-1]
            report.missing.append(f"{path}: recorded by {log.path.name} seq {last.seq}, not on disk "
                                  "(`dvc checkout` or `dvc pull` restores it)")
    for path in sorted((set(locked) | declared) - set(by_path)):
        if path in locked or (root / path).exists():
            problems.append(Problem(path, f"{'listed in dvc.lock' if path in locked else 'on disk'} but no run in "
                                          "the ledger produced it: was a run file deleted? restore "
                                          "ledger/runs/ from git, or rerun its stage (`dvc repro -f`)"))
    for path, md5 in sorted(locked.items()):
        recs = by_path.get(path)
        if recs and not any(r.body.get("dvc_md5") == md5 for _, r in recs):
            log, last = recs[-1]
            problems.append(Problem(
                f"dvc.lock {path}",
                f"md5 {md5} matches no ledger output for this path (last: {log.path.name} seq "
                f"{last.seq} recorded dvc md5 {last.body.get('dvc_md5')})",
            ))
    return problems


def _on_disk(root: Path, path: str, recs: list[tuple[RunLog, Record]], report: Report) -> list[Problem]:
    """The bytes at ``path`` must be one of its recorded versions."""
    report.outputs_checked += 1
    digest = hashing.path_digest(root / path)
    matching = [(log, r) for log, r in recs if r.body["digest"] == digest]
    log, last = recs[-1]
    if not matching:
        problems = [Problem(
            path,
            f"on disk it hashes to {digest}, which no run recorded; last recorded by "
            f"{log.path.name} seq {last.seq} as {last.body['digest']} (changed after it was recorded)",
        )]
        if "entries" in last.body:
            problems.extend(_entry_diff(root / path, path, log, last))
        return problems
    if matching[-1][1] is not last:
        report.notes.append(f"{path}: an older version is on disk (from {matching[-1][0].run_id})")
    return []


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


def check(root: Path, since: Head | None = None) -> Report:
    """Check the whole ledger of the project at ``root`` (and that it only grew since ``since``)."""
    logs = read_all(ledger_dir(root))
    report = Report(runs=len(logs), records=sum(len(log.records) for log in logs))
    for log in logs:
        report.problems.extend(check_run(log))
    report.problems.extend(check_outputs(root, logs, report))
    if since is not None:  # 8. nothing in the snapshot was deleted, rolled back or rewritten
        gone = head.since(since, {log.run_id: log for log in logs})
        report.problems.extend(Problem(where, what) for where, what in gone)
    return report
