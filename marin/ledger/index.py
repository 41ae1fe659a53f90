"""A derived index of the ledger: SQLite under ``.marin/index/`` (git-ignored, never committed).

The run files stay the source of truth: the index is rebuilt from them automatically and
incrementally whenever one changes (size, mtime, ctime or inode differ), and deleting it
loses nothing. A file that only grew, and whose last indexed line is still in place, is
indexed from that line on; any other change re-indexes the file. Lines are parsed, not
validated: validation happens when a record is appended and in ``marin ledger check``.

It answers, in time independent of the ledger's size: runs by stage, recipe and status;
the runs that produced or read a digest; unfinished runs of a recipe; each file's last seq
and digest and the compact Merkle range of its records (so ``run.finished`` need not re-read
a long run); output hashes by (path, size, mtime, inode); what was mirrored to MLflow.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import stat
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from marin import hashing
from marin.ledger import merkle
from marin.ledger.records import AFTER_FINISH
from marin.ledger.store import open_run, run_lines
from marin.paths import ledger_dir

VERSION = 1
T = TypeVar("T")
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files(
  run_id TEXT PRIMARY KEY, size INT, mtime_ns INT, ctime_ns INT, ino INT,
  indexed INT, last_start INT, records INT, last_seq INT, last_digest TEXT, merkle TEXT,
  stage TEXT, recipe TEXT, started TEXT, status TEXT, finished TEXT, problem TEXT);
CREATE INDEX IF NOT EXISTS files_stage ON files(stage, started);
CREATE INDEX IF NOT EXISTS files_recipe ON files(recipe, status);
CREATE TABLE IF NOT EXISTS entities(
  run_id TEXT, seq INT, role TEXT, name TEXT, path TEXT, digest TEXT, body TEXT);
CREATE INDEX IF NOT EXISTS entities_digest ON entities(digest, role);
CREATE INDEX IF NOT EXISTS entities_run ON entities(run_id, seq);
CREATE INDEX IF NOT EXISTS entities_path ON entities(path, role);
CREATE TABLE IF NOT EXISTS hashes(
  path TEXT PRIMARY KEY /* device:inode */, size INT, mtime_ns INT, ctime_ns INT, ino INT, sha256 TEXT, md5 TEXT);
CREATE TABLE IF NOT EXISTS synced(uri TEXT, run_id TEXT, seq INT, digest TEXT, PRIMARY KEY(uri, run_id));
"""


@dataclass(frozen=True)
class RunRow:
    """One run as the index knows it."""

    run_id: str
    stage: str | None
    recipe: str | None
    started: str | None
    status: str
    finished: str | None
    records: int
    last_seq: int | None
    last_digest: str | None
    truncated: bool = False  # bytes after the last complete line (a crash mid-write)


_ROW = "run_id, stage, recipe, started, status, finished, records, last_seq, last_digest, size > indexed"


def index_path(root: Path) -> Path:
    return Path(root) / ".marin" / "index" / "ledger.sqlite"


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


Entity = tuple[str, int, str, dict[str, Any]]  # (run id, seq, role, body) of an input, output or checkpoint


class Index:
    """Open with :meth:`open`; every query sees the run files as they are at open (or refresh)."""

    def __init__(self, root: Path, db: sqlite3.Connection):
        self.root, self.db = Path(root), db
        self.ledger = ledger_dir(self.root)

    @classmethod
    def open(cls, root: Path, refresh: bool = True) -> Index:
        """The project's index, created or brought up to date with the run files."""
        try:
            db = _connect(index_path(root))
        except (OSError, sqlite3.Error):  # a read-only checkout, a full disk: index in memory, for this command
            db = sqlite3.connect(":memory:", isolation_level=None)
            db.executescript(SCHEMA)
        idx = cls(root, db)
        if refresh:
            idx.refresh()
        return idx

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def whole(self) -> Index:
        """The index itself (:class:`marin.ledger.query.IndexLike`: a view's is the index it views)."""
        return self

    @classmethod
    @contextmanager
    def using(cls, root: Path, index: Index | None, refresh: bool = True) -> Generator[Index, None, None]:
        """``index`` (the command's, opened once and passed down), else the project's index opened
        for this block and closed after it; brought up to date first unless ``refresh`` is False."""
        idx = index or cls.open(root, refresh=False)
        try:
            if refresh:
                idx.refresh()
            yield idx
        finally:
            if index is None:
                idx.close()

    # -- keeping up with the run files -----------------------------------------------------

    def refresh(self, run_ids: list[str] | None = None) -> int:
        """Index what changed (all files, or only ``run_ids``); returns how many files were read."""
        on_disk = self._scan(run_ids)
        if not any(self._changes(on_disk, run_ids)):
            return 0  # nothing to write: no lock taken
        with self.writing():  # one writer at a time; what it reads is current
            gone, changed = self._changes(on_disk, run_ids)
            for run_id in gone:
                self._forget(run_id)
            for run_id in changed:
                self._index_file(run_id, on_disk[run_id])
        return len(changed)

    def _changes(self, on_disk: dict[str, os.stat_result], run_ids: list[str] | None) -> tuple[list[str], list[str]]:
        known = {r[0]: tuple(r[1:]) for r in self.db.execute("SELECT run_id, size, mtime_ns, ctime_ns, ino FROM files")}
        scope = known if run_ids is None else [k for k in run_ids if k in known]
        gone = [k for k in scope if k not in on_disk]
        changed = [k for k, st in on_disk.items() if known.get(k) != stat_key(st)]
        return gone, changed

    @contextmanager
    def writing(self) -> Generator[None, None, None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _scan(self, run_ids: list[str] | None) -> dict[str, os.stat_result]:
        if run_ids is not None:
            out: dict[str, os.stat_result] = {}
            for rid in run_ids:
                with suppress(FileNotFoundError):
                    st = os.lstat(self.ledger / f"{rid}.jsonl")
                    if stat.S_ISREG(st.st_mode):  # a fifo, a directory or a link is no run file
                        out[rid] = st
            return out
        try:
            entries = list(os.scandir(self.ledger))
        except FileNotFoundError:
            return {}
        return {e.name.removesuffix(".jsonl"): e.stat() for e in entries
                if e.name.endswith(".jsonl") and e.is_file(follow_symlinks=False)}

    def _forget(self, run_id: str) -> None:
        self.db.execute("DELETE FROM files WHERE run_id=?", (run_id,))
        self.db.execute("DELETE FROM entities WHERE run_id=?", (run_id,))

    def _index_file(self, run_id: str, st: os.stat_result) -> None:
        """Index new lines only if the file grew past an intact last line, else all of it."""
        row = self.db.execute("SELECT indexed, last_start, last_digest, ino, records, merkle, stage, recipe, "
                              "started, status, finished, last_seq FROM files WHERE run_id=?", (run_id,)).fetchone()
        path = self.ledger / f"{run_id}.jsonl"
        grew = row is not None and row[3] == st.st_ino and st.st_size > row[0]  # else: re-read it all
        state = _FileState.resume(row) if grew and row is not None else None
        with open_run(path) as f:
            if state is not None and not state.tail_intact(f):
                state = None
            if state is None:
                self._forget(run_id)
                state = _FileState()
            f.seek(state.indexed)
            for line in run_lines(f, path):
                if not line.endswith(b"\n") or not state.add(line, self._entity(run_id)):
                    break  # a torn or unparsable line: `ledger check` names it; index what came before
        self.db.execute(
            "INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, *stat_key(st), state.indexed, state.last_start, state.records, state.last_seq,
             state.last_digest, json.dumps(state.merkle.state()), state.stage, state.recipe, state.started,
             state.status, state.finished, state.problem))

    def _entity(self, run_id: str) -> Any:
        def add(seq: int, role: str, body: dict[str, Any]) -> None:
            self.db.execute("INSERT INTO entities VALUES (?,?,?,?,?,?,?)",
                            (run_id, seq, role, body.get("name"), body.get("path"), body.get("digest"),
                             json.dumps(body, sort_keys=True)))
        return add

    # -- queries ---------------------------------------------------------------------------

    def unreadable(self) -> dict[str, str]:
        """run id -> "line N: why" of every run file whose indexing stopped at a line that is not a record:
        what follows that line is not in the index."""
        return dict(self.db.execute("SELECT run_id, problem FROM files WHERE problem IS NOT NULL ORDER BY run_id"))

    def runs(self, stage: str | None = None, include_unstarted: bool = False, last: int | None = None) -> list[RunRow]:
        """Runs that started (or every run file), oldest first, optionally of one stage, or only the ``last`` N."""
        q = f"SELECT {_ROW} FROM files"
        args: tuple[Any, ...] = ()
        if stage is not None:
            q, args = q + " WHERE stage=?", (stage,)
        elif not include_unstarted:
            q += " WHERE stage IS NOT NULL"
        if last is None:
            return [RunRow(*r) for r in self.db.execute(q + " ORDER BY started, run_id", args)]
        rows = self.db.execute(q + " ORDER BY started DESC, run_id DESC LIMIT ?", (*args, last))
        return [RunRow(*r) for r in rows][::-1]

    def count(self, stage: str | None = None) -> int:
        if stage is None:
            return int(self.db.execute("SELECT COUNT(*) FROM files").fetchone()[0])
        return int(self.db.execute("SELECT COUNT(*) FROM files WHERE stage=?", (stage,)).fetchone()[0])

    def run(self, run_id: str) -> RunRow | None:
        r = self.db.execute(f"SELECT {_ROW} FROM files WHERE run_id=?", (run_id,)).fetchone()
        return RunRow(*r) if r else None

    def unfinished(self, stage: str, recipe: str) -> list[str]:
        """Run ids of unfinished runs of ``stage`` with ``recipe``, oldest first."""
        return [r[0] for r in self.db.execute(
            "SELECT run_id FROM files WHERE stage=? AND recipe=? AND status='unfinished' ORDER BY started",
            (stage, recipe))]

    def entities(self, *, digest: str | None = None, run_id: str | None = None, path: str | None = None,
                 role: str | None = None) -> list[Entity]:
        """(run id, seq, role, body) of inputs/outputs/checkpoints matching every given field, in file order."""
        conds: list[str] = []
        args: list[str] = []
        for col, val in (("digest", digest), ("run_id", run_id), ("path", path), ("role", role)):
            if val is not None:
                conds.append(f"{col}=?")
                args.append(val)
        q = "SELECT run_id, seq, role, body FROM entities" + (" WHERE " + " AND ".join(conds) if conds else "")
        return [(r, s, ro, json.loads(b)) for r, s, ro, b in self.db.execute(q + " ORDER BY run_id, seq", args)]

    def digests_with_prefix(self, prefix: str, limit: int = 6) -> list[str]:
        """Distinct recorded digests starting with ``prefix`` (``sha256:<hex>``)."""
        hi = prefix + "\uffff"
        return [r[0] for r in self.db.execute(
            "SELECT DISTINCT digest FROM entities WHERE digest >= ? AND digest < ? ORDER BY digest LIMIT ?",
            (prefix, hi, limit))]

    def merkle_state(self, run_id: str) -> tuple[int, merkle.Builder] | None:
        """(bytes indexed, compact Merkle range over their records) of a run file."""
        r = self.db.execute("SELECT indexed, merkle, records, problem FROM files WHERE run_id=?",
                            (run_id,)).fetchone()
        if r is None or r[3] is not None:
            return None
        b = merkle.Builder.from_state(json.loads(r[1]))
        return (r[0], b) if b.size == r[2] else None

class _FileState:
    """What indexing one run file has learned so far; resumable from its ``files`` row."""

    def __init__(self) -> None:
        self.indexed = self.last_start = self.records = 0
        self.last_seq: int | None = None
        self.last_digest: str | None = None
        self.merkle = merkle.Builder()
        self.stage = self.recipe = self.started = self.finished = self.problem = None
        self.status = "unfinished"

    @classmethod
    def resume(cls, row: tuple[Any, ...]) -> _FileState:
        s = cls()
        (s.indexed, s.last_start, s.last_digest, _, s.records, m, s.stage, s.recipe, s.started, s.status,
         s.finished, s.last_seq) = row
        s.merkle = merkle.Builder.from_state(json.loads(m))
        return s

    def tail_intact(self, f: Any) -> bool:
        """The last indexed line is still where it was, with the same digest (the file only grew)."""
        if self.records == 0 or self.problem is not None:
            return self.records == 0 and self.problem is None
        f.seek(self.last_start)
        line = f.read(self.indexed - self.last_start)
        try:
            return json.loads(line).get("digest") == self.last_digest
        except (ValueError, AttributeError):
            return False

    def add(self, line: bytes, entity: Any) -> bool:
        """Index one complete line; False (and a problem noted) if it is not a record."""
        try:
            d = json.loads(line)
            seq, kind, body, digest = d["seq"], d["kind"], d["body"], d["digest"]
            self.merkle.append(hashing.parse(digest))
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            self.problem = f"line {self.records + 1}: {e}"
            return False
        self._record(seq, kind, body, d.get("time"), entity)
        self.last_start, self.indexed = self.indexed, self.indexed + len(line)
        self.records, self.last_seq, self.last_digest = self.records + 1, seq, digest
        return True

    def _record(self, seq: int, kind: str, body: dict[str, Any], time: str | None, entity: Any) -> None:
        if kind == "run.started" and self.records == 0:
            self.stage, self.recipe, self.started = body.get("stage"), body.get("recipe_digest"), time
        elif kind in ("input", "output"):
            entity(seq, kind, body)
        elif kind == "checkpoint":  # an output too: its digest is over the restored tensors
            entity(seq, "checkpoint", {"name": f"checkpoint:{body.get('step')}", "path": body.get("path"),
                                       "digest": body.get("digest")})
        if kind == "run.finished":
            self.status, self.finished = body.get("status", "unfinished"), time
        elif kind not in AFTER_FINISH:
            self.status, self.finished = "unfinished", None


def with_index(fn: Callable[..., T]) -> Callable[..., T]:
    """For ``fn(root, ..., index=...)``: a caller that passes no ``index`` (the command's) gets the
    project's, opened for the call and closed after it; either way one index serves the whole call."""
    @functools.wraps(fn)
    def call(root: Path, *args: Any, index: Index | None = None, **kw: Any) -> T:
        with Index.using(root, index, refresh=False) as idx:
            return fn(root, *args, index=idx, **kw)
    return call


def _connect(path: Path) -> sqlite3.Connection:
    """The index database, made anew if it is missing, of another version, or unreadable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        db = sqlite3.connect(path, timeout=60, isolation_level=None)  # transactions are explicit
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('version', ?)", (str(VERSION),))
            version = db.execute("SELECT value FROM meta WHERE key='version'").fetchone()[0]
            if version != str(VERSION):
                raise sqlite3.DatabaseError(f"index version {version}, this marin writes {VERSION}")
            return db
        except sqlite3.DatabaseError:
            db.close()
            if attempt == 2:
                raise
            for p in _db_files(path):
                p.unlink(missing_ok=True)  # derived data: rebuilt from the run files
    raise AssertionError("unreachable")


def _db_files(path: Path) -> Iterator[Path]:
    yield from (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))


def seed(path: Path, run_id: str, index: Index | None = None) -> tuple[int, merkle.Builder]:
    """Where the ledger index (``index``, else the project's) has the file's range, start from it
    (its last line checked); else from nothing. Either way the caller reads only the bytes not covered."""
    root = path.parent.parent.parent
    if path.parent != ledger_dir(root):  # a run file outside a project: no index to ask
        return 0, merkle.Builder()
    try:
        with Index.using(root, index, refresh=False) as idx:
            idx.refresh([run_id])
            found = idx.merkle_state(run_id)
    except (OSError, sqlite3.Error):
        found = None  # no usable index here (read-only disk, say): one read of the file instead
    return found if found is not None else (0, merkle.Builder())
