"""The ledger as a snapshot holds it: what ``marin report verify`` re-renders a report from.

A report is built from the ledger at its snapshot (``ledger_head.json``: each run's last seq and
record digest). Runs added since, and records appended since to runs it holds (a later evaluation,
a verification), are not what the report was about; re-rendering from them would make a signed
report look tampered with after any later run. :class:`AsOfIndex` answers the index's queries as
they were at the snapshot: runs it does not hold are absent, entities after its seq are ignored, and
a run the snapshot holds before its ``run.finished`` is unfinished. :class:`AsOfRuns` reads each run
file cut at the snapshot's seq; ``since`` (checked beside it) proves the kept records unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

from marin.ledger.head import Head
from marin.ledger.index import Entity, Index, RunRow
from marin.ledger.query import Ledger, Runs
from marin.ledger.store import RunLog, load_run


class AsOfIndex:
    """An :class:`Index` seen at ``snapshot`` (a :class:`marin.ledger.query.IndexLike`)."""

    def __init__(self, index: Index, snapshot: Head, root: Path):
        self._index, self._root = index, Path(root)
        self.held = {leaf.run_id: leaf.seq for leaf in snapshot.leaves}
        self._rows: dict[str, RunRow] = {}

    @property
    def whole(self) -> Index:
        return self._index

    def unreadable(self) -> dict[str, str]:
        return self._index.unreadable()  # the index's own, as the digests below

    def digests_with_prefix(self, prefix: str, limit: int = 6) -> list[str]:
        return self._index.digests_with_prefix(prefix, limit)

    def run(self, run_id: str) -> RunRow | None:
        row = self._index.run(run_id)
        return self._as_of(row) if row is not None and run_id in self.held else None

    def runs(self, stage: str | None = None, include_unstarted: bool = False, last: int | None = None) -> list[RunRow]:
        rows = [self._as_of(r) for r in self._index.runs(stage, include_unstarted) if r.run_id in self.held]
        return rows[-last:] if last else rows

    def entities(self, *, digest: str | None = None, run_id: str | None = None, path: str | None = None,
                 role: str | None = None) -> list[Entity]:
        found = self._index.entities(digest=digest, run_id=run_id, path=path, role=role)
        return [e for e in found if e[0] in self.held and e[1] <= self.held[e[0]]]

    def _as_of(self, row: RunRow) -> RunRow:
        """The row as it was at the snapshot (read from the file only when records were added since)."""
        seq = self.held[row.run_id]
        if row.last_seq == seq:
            return row
        if row.run_id not in self._rows:
            log = cut(load_run(self._root, row.run_id, validate=False), seq)
            fin = log.finished
            self._rows[row.run_id] = dataclasses.replace(
                row, status=log.status, finished=fin.time if fin is not None else None, records=len(log.records),
                last_seq=seq, last_digest=log.records[-1].digest if log.records else None, truncated=False)
        return self._rows[row.run_id]


def cut(log: RunLog, seq: int) -> RunLog:
    """``log`` without the records after ``seq``."""
    return dataclasses.replace(log, records=[r for r in log.records if r.seq <= seq], truncated=None)


class AsOfRuns(Runs):
    """Run files read as the snapshot holds them (cut at its seq); runs it does not hold are absent."""

    def __init__(self, root: Path, index: AsOfIndex):
        super().__init__(root, index)
        self._held = index.held

    def __getitem__(self, run_id: str) -> RunLog:
        if run_id not in self._held:
            raise KeyError(run_id)
        if run_id not in self._logs:
            self._logs[run_id] = cut(super().__getitem__(run_id), self._held[run_id])
        return self._logs[run_id]


def ledger_as_of(root: Path, index: Index, snapshot: Head, sources: Collection[str]) -> Ledger:
    """A :class:`Ledger` whose every read is the ledger at ``snapshot`` (``sources``: as for :class:`Ledger`)."""
    view = AsOfIndex(index, snapshot, root)
    ledger = Ledger(root, view, sources=sources)
    ledger.runs = AsOfRuns(Path(root), view)
    return ledger
