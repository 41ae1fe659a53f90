"""Atomic, durable file and directory writes: readers see the old version or the new one.

Every temporary sibling (``.<name>.XXXXXXXX.tmp``, a file or a directory) holds an
exclusive ``flock`` for as long as its writer lives. The next write of the same path
removes siblings whose lock is free (left by a killed process) and leaves the others.
A disk that fails mid-write (full, quota, read-only, I/O error) becomes a
:class:`WriteError` naming the path; the previous version stays in place.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import NoReturn

from marin.errors import StageError

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
_DISK_WORDS = ("no space left on device", "disk quota exceeded", "read-only file system",
               "input/output error", "file too large")
_HELD: set[tuple[int, int]] = set()  # (dev, inode) of this process's temporary directories
SPECIAL = ((stat.S_ISLNK, "is a symbolic link"), (stat.S_ISCHR, "is a character device"),
           (stat.S_ISBLK, "is a block device"), (stat.S_ISFIFO, "is a fifo"),
           (stat.S_ISSOCK, "is a socket"))  # what a file is that is neither regular nor a directory


class WriteError(StageError):
    """An output could not be written because the disk failed; nothing replaced it."""

    def __init__(self, path: Path, cause: str):
        self.path, self.cause = path, cause
        super().__init__(f"{shown(path)}: cannot write: {cause}; the previous version is left as it "
                         "was and nothing half-written remains; free space (or fix the disk) and rerun the stage")


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the working directory when it lies below it (as messages show it)."""
    p = Path(os.path.abspath(path))
    try:
        return p.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(p)


def disk_cause(e: BaseException) -> str | None:
    """'no space left on device' (etc.) when ``e`` is a failing disk, else None.

    pyarrow's OSErrors carry the errno, or only the C library's words in the message.
    """
    if not isinstance(e, OSError):
        return None
    if e.errno in DISK_ERRNOS:
        return os.strerror(e.errno).lower()
    return _disk_words(e)


def _disk_words(e: BaseException) -> str | None:
    text = str(e).lower()
    return next((w for w in _DISK_WORDS if w in text), None)


def failure_cause(e: BaseException) -> str | None:
    """``disk_cause`` of ``e`` or of an exception it was raised from; a library error that only
    quotes the system's words counts too (tensorstore under orbax: ``ValueError: RESOURCE_EXHAUSTED:
    ... No space left on device``)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        cause = disk_cause(cur) or _disk_words(cur)
        if cause is not None:
            return cause
        cur = cur.__cause__ or cur.__context__
    return None


def not_regular(mode: int) -> str | None:
    """What a file of ``mode`` (from ``lstat``) is when it is not a regular file ("is a fifo", ...)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    return next((w for test, w in SPECIAL if test(mode)), "is not a regular file")


def open_regular(path: str | os.PathLike[str], *, follow: bool = False) -> io.BufferedReader:
    """``path`` opened for reading only if it is a regular file, never blocking (a fifo opens at once
    with O_NONBLOCK) nor following a link (unless ``follow``: digests of a DVC checkout, whose cache
    may link); an OSError naming what it is otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW) | os.O_CLOEXEC)
    try:
        why = not_regular(os.fstat(fd).st_mode)
        if why is not None:
            raise OSError(errno.EINVAL, why, os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def _remove_if_unlocked(p: Path) -> bool | None:
    """Remove ``p`` if no live writer holds its lock: True if removed, False if held,
    None if it is gone or a symlink (not one of ours)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a live writer holds it (or flock is unsupported here: keep it to be safe)
        return False
    else:
        _remove(p)  # still holding the lock, so no writer can take it meanwhile
        return True
    finally:
        os.close(fd)


def clean_stale(path: Path) -> list[Path]:
    """Remove the temporary siblings of ``path`` that no live writer holds; return them."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    removed, live = [], False
    for p in sorted(path.parent.iterdir()):
        if pattern.fullmatch(p.name):
            done = _remove_if_unlocked(p)
            live = live or done is False
            if done:
                removed.append(p)
                print(f"marin: removed {shown(p)}, left behind by a stage that was killed", file=sys.stderr)
    old = path.with_name(f".{path.name}.old")
    if old.exists() and not live:  # only a live writer can be between the two renames of _swap
        _settle_old(old, path)
        removed.append(old)
    return removed


def remove_leftovers(path: Path) -> list[Path]:
    """:func:`clean_stale` for ``path`` under its folder's lock (what a stage does for its outputs as
    it starts, so that a killed run's leftovers go even when nothing is rewritten)."""
    if not path.parent.is_dir():
        return []
    with _parent_lock(path.parent):
        return clean_stale(path)


_LEFTOVER = re.compile(r"\.(.+)\.(?:[a-z0-9_]{8}\.tmp|old)")


def _held(p: Path) -> bool:
    """Whether a live writer holds ``p``'s lock (a link or a file that cannot be opened counts as held:
    it is not ours to judge)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the lock just taken
    return False


def leftovers(directory: Path) -> list[Path]:
    """The temporary siblings (``.<name>.XXXXXXXX.tmp``) and set-aside versions (``.<name>.old``) in
    ``directory`` that no live writer holds: what killed writers left. Nothing is removed."""
    found = [(p, m.group(1)) for p in (sorted(directory.iterdir()) if directory.is_dir() else [])
             if (m := _LEFTOVER.fullmatch(p.name))]
    held = {p for p, _ in found if p.suffix == ".tmp" and _held(p)}
    live = {name for p, name in found if p in held}  # only a live writer can be between the renames of _swap
    return [p for p, name in found if p not in held and (p.suffix == ".tmp" or name not in live)]


def _settle_old(old: Path, path: Path) -> None:
    """The previous version a killed swap set aside: dropped, or put back if ``path`` is gone."""
    if path.exists():
        _remove(old)
        print(f"marin: removed {shown(old)}, left behind by a stage that was killed", file=sys.stderr)
    else:
        os.replace(old, path)
        print(f"marin: restored {shown(path)} from {shown(old)}; a stage was killed mid-rename",
              file=sys.stderr)


def _lock(fd: int) -> None:
    # Some file systems (NFS) refuse flock on a read-only fd, as a directory's must be:
    # there nothing is locked, and clean_stale, unable to take the lock either, keeps it all.
    with suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX)


@contextmanager
def _parent_lock(parent: Path) -> Iterator[None]:
    """Makes creating-and-locking a temporary sibling atomic with respect to clean_stale."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _lock(fd)
        yield
    finally:
        os.close(fd)


def _new_tmp(path: Path, directory: bool) -> tuple[Path, int]:
    """A fresh locked temporary sibling of ``path`` and the fd holding its lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    own = _key(path.parent) in _HELD  # our own temporary directory: nobody else writes or cleans in it
    with nullcontext() if own else _parent_lock(path.parent):
        if not own:
            clean_stale(path)
        if directory:
            tmp = tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        else:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        _lock(fd)
    return Path(tmp), fd


def _reraise(e: OSError, path: Path, tmp: Path) -> NoReturn:
    """Raise a WriteError naming ``path`` (or its file) for a failing disk while writing ``tmp``.

    Other errors, and disk errors on a file outside ``path``'s directory (an input, say),
    propagate as they are.
    """
    cause = disk_cause(e)
    name = Path(os.path.abspath(e.filename)) if isinstance(e.filename, str) else None
    if cause is None or (name is not None and not name.is_relative_to(path.parent.absolute())):
        raise e
    raise WriteError(_final(name, path, tmp) if name else path, cause) from e


def _final(name: Path, path: Path, tmp: Path) -> Path:
    """Where ``name``, a file inside the temporary ``tmp``, lands once ``tmp`` becomes ``path``."""
    tmp = tmp.absolute()
    return path / name.relative_to(tmp) if name.is_relative_to(tmp) and name != tmp else path


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; a short write (the disk filling) is continued, so the next
    write raises the real error (ENOSPC, EFBIG)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def write_bytes(path: str | os.PathLike[str], data: bytes,
                before_publish: Callable[[Path], object] | None = None) -> None:
    """Write to a locked temporary sibling, fsync, rename over ``path``.

    ``before_publish(tmp)`` runs once the bytes are durable and before the rename (a stage
    records the output there: if the ledger cannot take the record, ``path`` is left as it was)."""
    path = Path(path)
    try:
        tmp, fd = _new_tmp(path, directory=False)
    except OSError as e:
        _reraise(e, path, path)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; outputs are meant to be shared
        write_all(fd, data)
        os.fsync(fd)
        if before_publish is not None:
            before_publish(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            _reraise(e, path, tmp)
        raise
    finally:
        os.close(fd)
    fsync_dir(path.parent)


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty locked temporary directory; on success it replaces ``path`` whole.

    On an exception the old ``path`` is left untouched and the temporary one removed; a
    failing disk becomes a WriteError naming the output.
    """
    path = Path(path)
    try:
        tmp, fd = _new_tmp(path, directory=True)
    except OSError as e:
        _reraise(e, path, path)
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    _HELD.add(key)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        _swap(tmp, path)
    except WriteError as e:  # from write_bytes inside tmp: name the final file
        if not e.path.absolute().is_relative_to(tmp.absolute()):
            raise
        raise WriteError(_final(e.path.absolute(), path, tmp), e.cause) from e
    except OSError as e:
        _reraise(e, path, tmp)
    finally:
        _HELD.discard(key)
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def _swap(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` over ``path``; the old version is set aside first and removed last."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)
        raise
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
