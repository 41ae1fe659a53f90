"""One run = one JSONL file under ledger/runs/. Atomic, durable, locked appends.

Each append takes an exclusive ``flock`` on the run file, reads the tail to learn
``seq`` and ``prev``, writes the whole line with one ``write``, then ``fsync``s. A write
or fsync that fails (a full disk) is undone under the same lock: the file is cut back to
its size before. A crash (power loss) leaves at most a truncated last line: every reader
detects and names it, and nothing earlier is lost.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from marin import hashing, readers
from marin.errors import LedgerError, SchemaError
from marin.fsutil import disk_cause, not_regular, shown, write_all
from marin.ledger import merkle
from marin.ledger.records import Record
from marin.ledger.runlog import RunLog
from marin.paths import ledger_dir

_ADVICE = "free space (or fix the disk) and rerun the stage"


def _cause(e: OSError) -> str:
    return disk_cause(e) or (os.strerror(e.errno).lower() if e.errno else str(e))


def read_run(path: str | os.PathLike[str], validate: bool = True, skip: tuple[str, ...] = ()) -> RunLog:
    """Parse a run file, a line at a time, keeping every valid record and naming every bad line.

    ``validate=False`` parses only (records were validated when appended; ``ledger check``
    validates every line): readers that trust the check pay for JSON, not for schemas.
    ``skip``: record kinds a reader does not need (lineage skips a long run's metric records),
    recognized from the line's bytes without parsing it."""
    path = Path(path)
    log = RunLog(path)
    marks = tuple(f'"kind":"{k}"'.encode() for k in skip)
    with open_run(path) as f:
        for i, line in enumerate(run_lines(f, path), start=1):
            if not line.endswith(b"\n"):
                log.truncated = line
                break
            if marks and not validate and any(m in line for m in marks) and _kind_of(line) in skip:
                continue
            try:
                log.records.append(Record.from_line(line, f"{path.name} line {i}", validate))
            except SchemaError as e:
                log.problems.append(str(e))
    return log


def _kind_of(line: bytes) -> str | None:
    """The top-level kind of a canonical line (keys sorted: ``kind`` follows ``digest``)."""
    i = line.rfind(b'","kind":"')
    return line[i + 10: line.index(b'"', i + 10)].decode() if i >= 0 else None


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a file name in ledger/runs, never a path out of it


class NoSuchRun(LedgerError):
    """No run file in the ledger has this run id."""


def run_path(root: Path, run_id: str) -> Path:
    """The file of run ``run_id`` under ``root``; NoSuchRun when there is none."""
    path = ledger_dir(root) / f"{run_id}.jsonl"
    if _RUN_ID.fullmatch(run_id) is None or _why_odd(path) != "":
        raise NoSuchRun(f"{run_id}: no such run in {ledger_dir(root)}; see `marin ledger log`")
    return path


class AmbiguousRun(NoSuchRun):
    """A short run id that more than one run's id matches."""


SHOWN_CANDIDATES = 10  # an ambiguous short id lists this many of the runs it matches, then how many more


def resolve_run_id(root: Path, given: str) -> str:
    """The whole id of run ``given`` in the ledger under ``root``: a run id, a unique prefix of one, or
    a run's 8-hex tail (MLflow shows ``train 1a2b3c4d``). NoSuchRun when no run matches, AmbiguousRun
    (one line listing them) when several do. Every command that takes a run id resolves it here."""
    folder = ledger_dir(root)
    if _RUN_ID.fullmatch(given) is None:
        raise NoSuchRun(f"{given}: no such run in {folder}; see `marin ledger log`")
    if _why_odd(folder / f"{given}.jsonl") == "":
        return given
    ids = [p.name.removesuffix(".jsonl") for p in run_files(folder)]
    found = [r for r in ids if r.startswith(given) or r.rsplit("-", 1)[-1] == given]
    if not found:
        raise NoSuchRun(f"{given}: no such run in {folder}; see `marin ledger log`")
    if len(found) > 1:
        more = f" and {len(found) - SHOWN_CANDIDATES} more" if len(found) > SHOWN_CANDIDATES else ""
        raise AmbiguousRun(f"run id {given!r} is ambiguous: {len(found)} runs match ("
                           f"{', '.join(found[:SHOWN_CANDIDATES])}{more}); give more of the id")
    return found[0]


def load_run(root: Path, run_id: str, validate: bool = True, skip: tuple[str, ...] = ()) -> RunLog:
    """Read run ``run_id`` of the ledger under ``root`` (see :func:`read_run`); NoSuchRun when missing."""
    return read_run(run_path(root, run_id), validate, skip)


def read_started(root: Path, run_id: str) -> Record:
    """The first record of run ``run_id`` (``run.started``), read without the rest of the file."""
    path = run_path(root, run_id)
    with open_run(path) as f:
        line = next(run_lines(f, path), b"")
    if not line.endswith(b"\n"):
        raise LedgerError(f"{path}: no complete first record; see `marin ledger check`")
    rec = Record.from_line(line, f"{path.name} line 1", False)
    if rec.kind != "run.started":
        raise LedgerError(f"{path}: line 1 is {rec.kind}, not run.started; see `marin ledger check`")
    return rec


def _fd_name(fd: int) -> str:
    try:
        return shown(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return "the run file"


def _read_tail(fd: int) -> tuple[Record | None, bool]:
    """Last complete record of the open file and whether a truncated line follows it."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None, False
    chunk, pos, buf = 1 << 16, size, b""
    while pos > 0:
        if len(buf) > readers.CAPS["run"].line:
            raise LedgerError(f"{_fd_name(fd)}: the last line is over the {readers.CAPS['run'].line:,}-byte cap "
                              "for one record; see `marin ledger check`")
        step = min(chunk, pos)
        pos -= step
        buf = os.pread(fd, step, pos) + buf
        body = buf[:-1] if buf.endswith(b"\n") else buf
        if b"\n" in body or pos == 0:
            break
    truncated = not buf.endswith(b"\n")
    complete = buf[: buf.rfind(b"\n") + 1] if truncated else buf
    lines = complete.rstrip(b"\n").split(b"\n")
    last = lines[-1] if lines and lines[-1] else None
    if last is None:
        return None, truncated
    return Record.from_line(last, "last complete record"), truncated


Body = Mapping[str, Any] | Callable[[int, bytes], Mapping[str, Any]]  # a TypedDict of marin.ledger.bodies
Seed = Callable[[], tuple[int, merkle.Builder]]  # a run file's Merkle range so far: (bytes covered, range)


class RunFile:
    """Appender for one run file. It keeps the compact Merkle range of the file's records as
    it appends (and catches up on lines others appended), so ``run.finished`` costs O(log n)."""

    def __init__(self, path: str | os.PathLike[str], run_id: str, seed: Seed | None = None):
        """``seed``: where the file's Merkle range starts (bytes covered, range over their records), asked
        once before the first append (:func:`marin.ledger.index.seed`: from the ledger index); else the
        whole file is read."""
        self.path = Path(path)
        self.run_id = run_id
        self._seed = seed
        self._range: tuple[int, merkle.Builder] | None = None  # (bytes covered, range over their records)

    @contextmanager
    def _locked(self) -> Generator[int, None, None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    def append(self, kind: str, body: Body) -> Record:
        """Append one record; seq and prev come from the file's tail, read under the lock.

        ``body`` may be a function of (the number of earlier records, their RFC 6962 root),
        computed under the same lock, as ``run.finished`` needs. If the write or fsync fails (a full
        disk, say), the file is cut back to its size before, and a LedgerError names it.
        """
        try:
            with self._locked() as fd:
                rec = self._next(fd, kind, body)
                self._write(fd, kind, rec.line(), rec.digest)
        except OSError as e:  # opening or locking the file
            raise LedgerError(f"{shown(self.path)}: cannot append the {kind} record: "
                              f"{_cause(e)}; nothing was written; {_ADVICE}") from None
        return rec

    def _next(self, fd: int, kind: str, body: Body) -> Record:
        """The record to append after the file's last one."""
        try:
            last, truncated = _read_tail(fd)
        except SchemaError as e:
            raise LedgerError(
                f"{self.path}: cannot append, the last record is invalid ({e}); "
                "run `marin ledger check` to see what happened"
            ) from None
        if truncated:
            raise LedgerError(
                f"{self.path}: the last line is truncated (a crash mid-write); run "
                f"`marin ledger repair {self.run_id}` to set it aside before appending"
            )
        seq = 0 if last is None else last.seq + 1
        prev = None if last is None else last.digest
        if callable(body):
            tree = self._caught_up(fd)
            body = body(tree.size, tree.root())
        return Record.create(self.run_id, seq, prev, kind, body)

    def _caught_up(self, fd: int) -> merkle.Builder:
        """The Merkle range over every record in the file: kept from our own appends, extended by
        lines others appended since, seeded from the ledger index (or one read) the first time."""
        size = os.fstat(fd).st_size
        covered, tree = self._range or (self._seed() if self._seed is not None else (0, merkle.Builder()))
        if covered > size:  # the file shrank under us (repair): start over
            covered, tree = 0, merkle.Builder()
        if size - covered > readers.CAPS["run"].size:
            raise LedgerError(f"{shown(self.path)}: over the {readers.CAPS['run'].size:,}-byte cap for a run file; "
                              "see `marin ledger check`")
        if covered < size:
            for line in os.pread(fd, size - covered, covered).splitlines():
                tree.append(hashing.parse(Record.from_line(line, self.path.name, validate=False).digest))
        self._range = (size, tree)
        return tree

    def _write(self, fd: int, kind: str, line: bytes, digest: str) -> None:
        """Write the whole line (O_APPEND) and fsync; on failure cut the file back to its size."""
        size = os.fstat(fd).st_size
        try:
            write_all(fd, line)  # one write, unless the disk fills mid-line
            os.fsync(fd)
        except OSError as e:
            undo = self._cut_back(fd, size)
            raise LedgerError(f"{shown(self.path)}: cannot append the {kind} record: {_cause(e)}; {undo}") from None
        if self._range is None and size == 0:
            self._range = (0, merkle.Builder())  # a new file: its range is ours to keep from the start
        if self._range is not None and self._range[0] == size:
            self._range[1].append(hashing.parse(digest))
            self._range = (size + len(line), self._range[1])

    def _cut_back(self, fd: int, size: int) -> str:
        """Truncate to ``size`` (an empty new file is removed); say what is left."""
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
            if size == 0:
                self.path.unlink(missing_ok=True)  # a run that never started; nobody else knows its id
        except OSError as e:
            return (f"cutting off the partial line failed too ({_cause(e)}); fix the disk, then run "
                    f"`marin ledger repair {self.run_id}`")
        return f"nothing was written; {_ADVICE}"

    def repair(self) -> bytes | None:
        """Move a truncated last line into ``<run>.jsonl.torn`` so appends can go on.

        Returns the bytes set aside (kept, not lost), or None if the tail was complete.
        """
        with self._locked() as fd:
            _, truncated = _read_tail(fd)
            if not truncated:
                return None
            data = readers.read_bytes(self.path, "run", LedgerError)
            cut = data.rfind(b"\n") + 1
            torn = data[cut:]
            side = self.path.with_suffix(".jsonl.torn")
            with open(side, "ab") as f:
                f.write(torn + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.ftruncate(fd, cut)
            os.fsync(fd)
            return torn


def open_run(path: Path) -> BinaryIO:
    """A run file opened for reading: a regular file only, never a fifo (it would block) or a link,
    within the run file's size cap (:data:`marin.readers.CAPS`); a LedgerError in one line otherwise."""
    return readers.open_file(path, "run", LedgerError)


def run_lines(f: BinaryIO, path: Path) -> Iterator[bytes]:
    """The lines of the open run file ``f``, each within the cap for one record (a LedgerError past it)."""
    return readers.stream_lines(f, path, "run", LedgerError)


def _why_odd(path: Path) -> str | None:
    """Why ``path`` (not followed) is not a regular file ("is a fifo", ...); "" if it is; None if gone."""
    try:
        return not_regular(path.lstat().st_mode) or ""
    except FileNotFoundError:
        return None


def run_files(ledger_dir: str | os.PathLike[str]) -> list[Path]:
    """The run files of the ledger: regular files named ``*.jsonl`` (:func:`odd_files` names the rest)."""
    d = Path(ledger_dir)
    return [p for p in sorted(d.glob("*.jsonl")) if _why_odd(p) == ""] if d.is_dir() else []


def odd_files(ledger_dir: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """(path, what it is) of every ``*.jsonl`` entry in the ledger that is not a regular file: a fifo,
    a directory, a link, a device. No reader opens them."""
    d = Path(ledger_dir)
    found = [(p, _why_odd(p)) for p in sorted(d.glob("*.jsonl"))] if d.is_dir() else []
    return [(p, why) for p, why in found if why]


def read_all(ledger_dir: str | os.PathLike[str]) -> list[RunLog]:
    """Every run in the ledger, oldest first (by the time of its first record)."""
    logs = [read_run(p) for p in run_files(ledger_dir)]
    return sorted(logs, key=lambda log: (log.records[0].time if log.records else "", log.run_id))
