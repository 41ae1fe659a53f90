"""The ledger head: a signed-able snapshot of every run, and the proof that history only grew.

``marin ledger head`` is an RFC 6962 Merkle root over the runs sorted by run id, one leaf
per run: the canonical JSON of ``{"run_id", "seq", "digest"}`` of its last record. A
snapshot (the root, the run count and the leaves) kept by someone else, or signed inside a
report, lets ``marin ledger check --since SNAPSHOT`` prove that every run it names is still
there, unchanged or only extended: a deleted run file, a rolled-back tail or a rewritten
record is named. A run created after the snapshot, or a record appended to one of its runs, is
allowed (history grows), if dated after the snapshot's head time: the latest of its ``time`` (the
latest start or end of its runs; outside the root; an ISO 8601 time, else the snapshot is refused)
and its runs' records at the seqs it holds (``marin.ledger.clock``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import hashing, readers
from marin.errors import LedgerError
from marin.ledger import clock, merkle
from marin.ledger.store import open_run, run_lines

if TYPE_CHECKING:
    from marin.ledger.index import Index

SNAPSHOT_KIND = "marin.ledger/head@1"


@dataclass(frozen=True)
class Leaf:
    run_id: str
    seq: int
    digest: str

    def encode(self) -> bytes:
        return hashing.canonical_json({"run_id": self.run_id, "seq": self.seq, "digest": self.digest})


@dataclass(frozen=True)
class Head:
    root: str
    leaves: tuple[Leaf, ...]
    time: str | None = None  # the latest run.started or run.finished time of its runs (None: an older snapshot)

    @property
    def runs(self) -> int:
        return len(self.leaves)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": SNAPSHOT_KIND, "root": self.root, "runs": self.runs,
                **({"time": self.time} if self.time else {}),
                "leaves": [{"run_id": x.run_id, "seq": x.seq, "digest": x.digest} for x in self.leaves]}


def root_of(leaves: tuple[Leaf, ...]) -> str:
    return hashing.fmt(merkle.merkle_root([x.encode() for x in leaves]))


def head(ledger_dir: Path, exclude: AbstractSet[str] = frozenset(), index: Index | None = None) -> Head:
    """The head of the ledger in ``ledger_dir``, from the derived index (each run's last record
    as indexed; the index re-reads a file whose size or times changed). ``index``: the command's,
    brought up to date here (else one is opened)."""
    from marin.ledger.index import Index

    with Index.using(ledger_dir.parent.parent, index) as idx:
        rows = [r for r in idx.runs(include_unstarted=True) if r.last_digest is not None and r.run_id not in exclude]
    leaves = tuple(sorted((Leaf(r.run_id, r.last_seq, r.last_digest) for r in rows
                           if r.last_seq is not None and r.last_digest is not None), key=lambda x: x.run_id))
    times = [t for r in rows for t in (r.started, r.finished) if t]
    return Head(root_of(leaves), leaves, max(times, key=clock.parse) if times else None)


def locate(ledger_dir: Path, snapshot: Head) -> dict[str, tuple[int | None, str | None]]:
    """What ``since`` needs, for the runs of ``snapshot`` still in ``ledger_dir``: (last seq, digest of the
    record at the snapshot's seq), each file read (parsed, not validated) only up to that record and its tail."""
    found: dict[str, tuple[int | None, str | None]] = {}
    for leaf in snapshot.leaves:
        path = ledger_dir / f"{leaf.run_id}.jsonl"
        try:
            f = open_run(path)
        except (FileNotFoundError, LedgerError):  # gone, or not a run file (`ledger check` names it)
            continue
        digest, last = None, None
        with f:
            for line in run_lines(f, path):
                if not line.endswith(b"\n"):
                    break
                try:
                    d = json.loads(line)
                    last = d["seq"]
                except (ValueError, KeyError, TypeError):
                    break
                if last == leaf.seq:
                    digest = d.get("digest")
        found[leaf.run_id] = (last, digest)
    return found


def parse_snapshot(data: Any, where: str) -> Head:
    """A snapshot document (``Head.to_dict``) checked for shape and against its own root."""
    try:
        if data.get("kind") != SNAPSHOT_KIND:
            raise ValueError(f"kind is {data.get('kind')!r}, expected {SNAPSHOT_KIND!r}")
        leaves = tuple(Leaf(str(x["run_id"]), int(x["seq"]), str(x["digest"])) for x in data["leaves"])
        root, runs = str(data["root"]), int(data["runs"])
        time = data.get("time")
        if time is not None and not _iso(time):  # garbage would read as the epoch: no record predates it
            raise ValueError(f"time is {str(time)[:60]!r}, not an ISO 8601 time")
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise LedgerError(f"{where}: not a ledger snapshot ({e}); make one with `marin ledger head --json`") from None
    if runs != len(leaves) or [x.run_id for x in leaves] != sorted({x.run_id for x in leaves}):
        raise LedgerError(f"{where}: the snapshot's runs are not {runs} distinct run ids in order")
    if root_of(leaves) != root:
        raise LedgerError(f"{where}: the snapshot's leaves hash to {root_of(leaves)}, not its root {root} "
                          "(the snapshot was edited)")
    return Head(root, leaves, time)


def _iso(t: Any) -> bool:
    try:
        return isinstance(t, str) and bool(dt.datetime.fromisoformat(t))
    except ValueError:
        return False


def load_snapshot(path: Path) -> Head:
    """A snapshot from a JSON file (``marin ledger head --json``, or a report's ledger_head.json
    once its statement vouched for it: ``marin.report.check.report_snapshot``)."""
    try:
        data = json.loads(readers.read_bytes(os.path.realpath(path), "snapshot", LedgerError))
    except FileNotFoundError:
        raise LedgerError(f"{path}: no such snapshot; give a file from `marin ledger head --json` "
                          "or a report directory") from None
    except (OSError, ValueError) as e:
        raise LedgerError(f"{path}: cannot read the snapshot ({e})") from None
    return parse_snapshot(data, str(path))


def since(snapshot: Head, found: dict[str, tuple[int | None, str | None]]) -> list[tuple[str, str]]:
    """(run file, what changed) for every run of ``snapshot`` that is gone, shorter or rewritten.

    ``found`` maps each run id in the ledger now to (its last seq, the digest of its record at
    the seq the snapshot holds for it, or None)."""
    out: list[tuple[str, str]] = []
    for leaf in snapshot.leaves:
        name = f"{leaf.run_id}.jsonl"
        if leaf.run_id not in found:
            out.append((name, f"in the snapshot {snapshot.root[:19]}… (seq {leaf.seq}) but the run file is gone: "
                              "was it deleted? restore it from git (`git checkout -- ledger/runs/`)"))
            continue
        last, digest = found[leaf.run_id]
        if digest is None:
            out.append((name, f"the snapshot has seq {leaf.seq}, the file ends at seq {last}: "
                              "records were removed (rolled back)"))
        elif digest != leaf.digest:
            out.append((f"{name} seq {leaf.seq}", f"is now {digest}, the snapshot has {leaf.digest}: "
                                                  "the history was rewritten"))
    return out
