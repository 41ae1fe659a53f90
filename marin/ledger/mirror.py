"""What the MLflow mirror at each tracking URI has seen of the ledger (``marin mlflow sync``): the last
record of each run it holds, kept in the ledger index, so a sync reads only the runs that changed."""

from __future__ import annotations

from marin.ledger.index import Index


def synced(idx: Index, uri: str) -> dict[str, tuple[int, str]]:
    """(seq, digest) of the last record the mirror at ``uri`` has seen, by run id."""
    return {r[0]: (r[1], r[2]) for r in idx.db.execute(
        "SELECT run_id, seq, digest FROM synced WHERE uri=?", (uri,))}


def mark_synced(idx: Index, uri: str, run_id: str, seq: int, digest: str) -> None:
    with idx.writing():
        idx.db.execute("INSERT OR REPLACE INTO synced VALUES (?,?,?,?)", (uri, run_id, seq, digest))


def unsynced(idx: Index, uri: str) -> list[str]:
    """Run ids whose last record the mirror at ``uri`` has not seen, oldest first."""
    return [r[0] for r in idx.db.execute(
        "SELECT f.run_id FROM files f LEFT JOIN synced s ON s.uri=? AND s.run_id=f.run_id "
        "WHERE f.stage IS NOT NULL AND (s.digest IS NULL OR s.digest != f.last_digest) "
        "ORDER BY f.started, f.run_id", (uri,))]
