"""Read members of a raw archive (tar, zip, a directory or a single file) by glob.

Members are read as streams (:func:`open_members`), never extracted; :func:`members` reads
each whole. An archive with any member that could escape it or is not a plain file or
directory (a '..' or absolute name, a link, a device, a fifo) is refused whole, as is one
declaring hostile sizes (over MAX_MEMBER_BYTES per member, or a zip member expanding more
than MAX_RATIO times its compressed size), or hostile totals (:mod:`marin.data.bounds`: over
100,000 members, or a zip whose members expand over MAX_RATIO times the archive). A compressed
tar, and a ``.gz`` or ``.zst`` member read through :func:`decompressed`, are held to the same
ratio and read through :class:`marin.data.streams.Streams` (a run of zeros or empty streams is
refused at the first).

Members come in path order, whatever order a tar stores them in: a compressed tar is read in
one streaming pass, each selected member spooled zstd-compressed, then read back sorted
(:func:`_spooled`); an uncompressed one seeks.

What a file is comes from its name, then its bytes are checked (:func:`kind`): ``.tar`` (also
``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz``) must carry a ustar header, ``.zip`` a zip
signature; any other name is one plain file, whatever its bytes (a file of zeros is not an
empty tar). The archive itself must be a regular file or directory on a disk: a fifo, a
device or a kernel pseudo-file (/proc, /sys, /dev: its size says nothing of its bytes) is
refused (:func:`marin.filetree.file_problem`).
"""

from __future__ import annotations

import fnmatch
import gzip
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

from marin.data import bounds
from marin.data.bounds import RATIO_MIN_BYTES
from marin.data.streams import FORMATS, MAX_RATIO, Readable, Streams, read_exactly
from marin.errors import StageError
from marin.filetree import file_problem, tree_problem
from marin.fsutil import SPECIAL, shown

MAX_MEMBER_BYTES = 4 << 30
TAR_NAMES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
ZIP_NAMES = (".zip",)
_DRIVE = re.compile(r"^[A-Za-z]:")


def kind(path: Path) -> str:
    """``dir``, ``tar``, ``zip`` or ``file``: decided by the name (:data:`TAR_NAMES`,
    :data:`ZIP_NAMES`), then checked against the bytes; a name that lies is refused."""
    why = file_problem(path)
    if why is not None:
        raise StageError(f"{shown(path)} {why}; refusing it (nothing was read): use a regular file or directory")
    if stat.S_ISDIR(path.stat().st_mode):
        return "dir"
    name = path.name.lower()
    if name.endswith(TAR_NAMES):
        try:
            with open(path, "rb") as raw:
                f = Streams(raw, name, path) if Path(name).suffix in FORMATS else raw
                block = read_exactly(f, 512)
        except (OSError, EOFError, lzma.LZMAError, zlib.error, zstandard.ZstdError) as e:
            block = b""
            detail = f" ({e})"
        else:
            detail = ""
        if len(block) < 512 or block[257:262] != b"ustar":
            raise StageError(f"{shown(path)}: named like a tar archive but its first block has no ustar header"
                             f"{detail}; refusing it (a file of zeros is not an archive): fetch it again, or "
                             "rename it if it is not a tar")
        return "tar"
    if name.endswith(ZIP_NAMES):
        with open(path, "rb") as f:
            head = f.read(4)
        if head not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise StageError(f"{shown(path)}: named .zip but does not start with a zip signature; refusing it: "
                             "fetch it again, or rename it if it is not a zip")
        return "zip"
    return "file"


def name_problem(name: str) -> str | None:
    """Why a member name is unsafe (absolute, '..', backslash, drive letter), or None."""
    if "\\" in name or _DRIVE.match(name):
        return "has a Windows path (backslash or drive letter)"
    if name.startswith("/") or ".." in name.split("/"):
        return "escapes the archive (absolute or '..' path)"
    if "\0" in name:
        return "has a NUL byte in its name"
    return None


def _size_problem(size: int) -> str | None:
    if size > MAX_MEMBER_BYTES:
        return f"declares {size:,} bytes uncompressed, over the {MAX_MEMBER_BYTES:,}-byte limit per member"
    return None


def tar_problem(m: tarfile.TarInfo) -> str | None:
    """Why a tar member must not be read (unsafe name, link, device, fifo, size), or None."""
    if m.issym():
        return f"is a symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"is a hard link (to {m.linkname!r})"
    if m.ischr() or m.isblk():
        return f"is a {'character' if m.ischr() else 'block'} device"
    if m.isfifo():
        return "is a fifo"
    if not (m.isfile() or m.isdir()):
        return f"has tar type {m.type!r}, not a regular file or directory"
    return name_problem(m.name) or _size_problem(m.size)


def zip_problem(info: zipfile.ZipInfo) -> str | None:
    """Why a zip member must not be read (unsafe name, link or device, size, ratio), or None."""
    mode = info.external_attr >> 16  # the Unix mode, when the archive was made on Unix
    for test, what in SPECIAL:
        if info.create_system == 3 and test(mode):
            return what
    problem = name_problem(info.filename) or _size_problem(info.file_size)
    if problem is None and info.file_size > RATIO_MIN_BYTES:
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > MAX_RATIO:
            problem = (f"expands {ratio:,.0f} times ({info.file_size:,} bytes from {info.compress_size:,}), "
                       f"over the {MAX_RATIO}x limit (a zip bomb?)")
    return problem


def _refuse(archive: Path, name: str, why: str) -> StageError:
    return StageError(
        f"{shown(archive)}: member {name!r} {why}; refusing the archive (nothing was extracted); "
        "use an archive without such members, or repack it and pin its new sha256 in params.yaml"
    )


def _selected(name: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in include) and not any(
        fnmatch.fnmatchcase(name, p) for p in exclude
    )


@dataclass
class Member:
    """A selected regular file of an archive; ``stream`` is readable until the next member."""

    name: str
    size: int  # bytes, uncompressed as the archive stores them
    stream: Readable
    path: Path | None = None  # the file itself, for a directory's members or a single-file archive


def members(
    archive: Path, include: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> Iterator[tuple[str, bytes]]:
    """(member path, bytes) of every selected regular file, sorted by path (each read whole)."""
    for m in open_members(archive, include, exclude):
        yield m.name, m.stream.read()


def open_members(
    archive: Path, include: tuple[str, ...], exclude: tuple[str, ...] = (), spool: Path | None = None
) -> Iterator[Member]:
    """Every selected regular file as a stream, sorted by path. Every member is checked,
    selected or not, before the first one is read. ``spool``: a directory where a compressed
    tar whose members are not stored in path order is decompressed once, so reading them in
    path order does not re-decompress from the start for each one."""
    if archive.is_symlink():
        raise _refuse(archive.parent, archive.name, "is a symbolic link")
    what = kind(archive)
    if what == "dir":
        yield from _dir_members(archive, include, exclude)
    elif what == "tar":
        yield from _tar_members(archive, include, exclude, spool)
    elif what == "zip":
        yield from _zip_members(archive, include, exclude)
    elif _selected(archive.name, include, exclude):
        with open(archive, "rb") as f:
            yield Member(archive.name, os.fstat(f.fileno()).st_size, f, archive)


def tar_names(archive: Path) -> list[str]:
    """The regular files of a tar (already :func:`kind`-checked), sorted, each header checked, in one
    pass through bounded streams (:class:`Streams`), its data skipped."""
    with open(archive, "rb") as raw:
        compressed = Path(archive.name.lower()).suffix in FORMATS
        stream = Streams(raw, archive.name, archive, _tar_limit(archive)) if compressed else raw
        try:
            tf = tarfile.open(fileobj=stream, mode="r|")  # pyright: ignore[reportCallIssue, reportArgumentType]  # noqa: SIM115 (closed by the with below)
        except _READ_ERRORS as e:
            raise _unreadable(archive, "tar", e) from None
        with tf:
            return sorted(m.name for m in _tar_infos(archive, tf))


def _tar_limit(archive: Path) -> int:
    return max(archive.stat().st_size * MAX_RATIO, RATIO_MIN_BYTES)


def _dir_members(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[Member]:
    bad = tree_problem(archive)
    if bad is not None:
        raise _refuse(archive, *bad)
    files = {p.relative_to(archive).as_posix(): p for p in archive.rglob("*") if p.is_file()}
    for name in sorted(files):
        if _selected(name, include, exclude):
            with open(files[name], "rb") as f:
                yield Member(name, os.fstat(f.fileno()).st_size, f, files[name])


# what a corrupt or truncated archive raises while it is read (a truncated gzip or xz stream: EOFError, LZMAError)
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, tarfile.TarError, gzip.BadGzipFile, zstandard.ZstdError,
                lzma.LZMAError)


def _unreadable(archive: Path, kind: str, e: BaseException) -> StageError:
    return StageError(f"{shown(archive)}: not a readable {kind} archive ({e or type(e).__name__}); fetch it again")


def _tar_infos(archive: Path, tf: tarfile.TarFile, lazy: bool = False) -> Iterator[tarfile.TarInfo]:
    """The regular files of ``tf``, header by header: a bad one is refused before its data is even skipped.
    Checked all before the first is given, unless ``lazy`` (a stream, whose members are read as they come)."""
    def walk() -> Iterator[tarfile.TarInfo]:
        try:
            for n, m in enumerate(tf, 1):
                if (err := bounds.too_many(archive, n)) is not None:
                    raise err
                why = tar_problem(m)
                if why is not None:
                    raise _refuse(archive, m.name, why)
                if m.isfile():
                    yield m
        except _READ_ERRORS as e:
            raise _unreadable(archive, "tar", e) from None
    return walk() if lazy else iter(list(walk()))


def _tar_members(
    archive: Path, include: tuple[str, ...], exclude: tuple[str, ...], spool: Path | None
) -> Iterator[Member]:
    if archive.name.lower().endswith(".tar"):  # seekable: headers first, then members read in path order
        try:
            tf = tarfile.open(archive)  # noqa: SIM115 (closed by the with below; its opening is what may fail)
        except _READ_ERRORS as e:
            raise _unreadable(archive, "tar", e) from None
        with tf:
            for m in sorted((m for m in _tar_infos(archive, tf) if _selected(m.name, include, exclude)),
                            key=lambda m: m.name):
                f = tf.extractfile(m)
                if f is None:
                    raise StageError(f"{shown(archive)}: cannot read member {m.name}")
                yield Member(m.name, m.size, _Checked(f, archive, m.name))
        return
    if spool is None:
        with tempfile.TemporaryDirectory(prefix="marin-tar-") as tmp:
            yield from _tar_members(archive, include, exclude, Path(tmp))
        return
    yield from _spooled(archive, include, exclude, spool)


def _spooled(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...], spool: Path) -> Iterator[Member]:
    """A compressed tar in one streaming pass, whatever its member order: every header checked,
    each selected member copied to ``spool`` zstd-compressed (a seek back in a gzip or xz stream
    decompresses again from the start; spooling the whole tar cost 7.5 GiB for a 1.2 MB .tar.xz),
    then the members read back in path order, each file removed once read."""
    kept: list[tuple[str, int, Path]] = []
    try:
        with open(archive, "rb") as raw:
            stream = Streams(raw, archive.name, archive, _tar_limit(archive))
            with tarfile.open(fileobj=stream, mode="r|") as tf:  # pyright: ignore[reportCallIssue, reportArgumentType]
                for i, m in enumerate(_tar_infos(archive, tf, lazy=True)):
                    if _selected(m.name, include, exclude):
                        kept.append((m.name, m.size, _spool_member(tf, m, archive, spool / f"member-{i}.zst")))
        for name, size, path in sorted(kept, key=lambda k: k[0]):  # stable: a repeated name keeps archive order
            with open(path, "rb") as f:
                reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
                yield Member(name, size, _Checked(reader, archive, name))
            path.unlink()
    finally:
        for _, _, path in kept:
            path.unlink(missing_ok=True)


def _spool_member(tf: tarfile.TarFile, m: tarfile.TarInfo, archive: Path, dest: Path) -> Path:
    f = tf.extractfile(m)
    if f is None:
        raise StageError(f"{shown(archive)}: cannot read member {m.name}")
    with open(dest, "wb") as out, zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) as w:
        shutil.copyfileobj(_Checked(f, archive, m.name), w, 1 << 20)
    return dest


def _zip_members(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[Member]:
    bounds.zip_directory(archive)  # before zipfile builds an object per entry
    try:
        zf = zipfile.ZipFile(archive)
    except _READ_ERRORS as e:
        raise _unreadable(archive, "zip", e) from None
    with zf:
        infos = zf.infolist()
        if (err := bounds.too_many(archive, len(infos))) is not None:
            raise err
        for info in infos:
            why = zip_problem(info)
            if why is not None:
                raise _refuse(archive, info.filename, why)
        if (err := bounds.expansion(archive, sum(i.file_size for i in infos))) is not None:
            raise err  # each member within its bounds, the whole not (10,000 members of 1 MiB of zeros)
        for info in sorted((i for i in infos if not i.is_dir()), key=lambda i: i.filename):
            if _selected(info.filename, include, exclude):
                with zf.open(info) as f:
                    yield Member(info.filename, info.file_size, _Checked(f, archive, info.filename))


class _Checked:
    """A member's stream whose read errors (corrupt data, more bytes than declared, a
    truncated archive) are one StageError naming the archive and member; with ``limit``,
    reading past that many bytes is refused as a decompression bomb."""

    def __init__(self, raw: Readable, archive: Path, name: str, limit: int | None = None):
        self.raw, self.archive, self.name, self.limit, self.done = raw, archive, name, limit, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.raw.read(n)
        except _READ_ERRORS as e:
            raise StageError(f"{shown(self.archive)}: member {self.name!r} is corrupt ({e}); "
                             "refusing the archive; fetch it again") from None
        self.done += len(data)
        if self.limit is not None and self.done > self.limit:
            raise _refuse(self.archive, self.name, f"expands to over {self.limit:,} bytes, more than "
                          f"{MAX_RATIO}x its stored size (a decompression bomb?)")
        return data


def decompressed(m: Member, archive: Path) -> Readable:
    """``m``'s bytes, decompressed if its name ends in ``.gz`` or ``.zst``, at most MAX_RATIO
    times its stored size (or RATIO_MIN_BYTES); other members as they are."""
    if not m.name.endswith((".gz", ".zst")):
        return m.stream
    limit = max(m.size * MAX_RATIO, RATIO_MIN_BYTES)
    return _Checked(Streams(m.stream, m.name, archive, label=m.name), archive, m.name, limit)
