"""Read members of a raw archive (tar, zip, a directory or a single file) by glob.

Members are read into memory, never extracted. An archive with any member that could
escape it or is not a plain file or directory (a '..' or absolute name, a link, a device,
a fifo) is refused whole, as is one declaring hostile sizes (over MAX_MEMBER_BYTES per
member, or a zip member expanding more than MAX_RATIO times its compressed size).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from marin.errors import StageError
from marin.fsutil import shown

MAX_MEMBER_BYTES = 4 << 30
MAX_RATIO = 200  # deflate tops out near 1032:1; text compresses 3-10:1
RATIO_MIN_BYTES = 1 << 20  # below this a high ratio cannot hurt
_DRIVE = re.compile(r"^[A-Za-z]:")
_SPECIAL = ((stat.S_ISLNK, "is a symbolic link"), (stat.S_ISCHR, "is a character device"),
            (stat.S_ISBLK, "is a block device"), (stat.S_ISFIFO, "is a fifo"),
            (stat.S_ISSOCK, "is a socket"))


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
    for test, what in _SPECIAL:
        if info.create_system == 3 and test(mode):
            return what
    problem = name_problem(info.filename) or _size_problem(info.file_size)
    if problem is None and info.file_size > RATIO_MIN_BYTES:
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > MAX_RATIO:
            problem = (f"expands {ratio:,.0f} times ({info.file_size:,} bytes from {info.compress_size:,}), "
                       f"over the {MAX_RATIO}x limit (a zip bomb?)")
    return problem


def tree_problem(root: Path) -> tuple[str, str] | None:
    """(relative path, why) of the first entry under directory ``root`` that is not a
    plain file or directory (a symlink, device, fifo, socket), or None."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            mode = p.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                what = next((w for test, w in _SPECIAL if test(mode)), "is not a regular file")
                return p.relative_to(root).as_posix(), what
    return None


def _refuse(archive: Path, name: str, why: str) -> StageError:
    return StageError(
        f"{shown(archive)}: member {name!r} {why}; refusing the archive (nothing was extracted); "
        "use an archive without such members, or repack it and pin its new sha256 in params.yaml"
    )


def _selected(name: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in include) and not any(
        fnmatch.fnmatchcase(name, p) for p in exclude
    )


def members(
    archive: Path, include: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> Iterator[tuple[str, bytes]]:
    """(member path, bytes) of every selected regular file, sorted by path. Every member
    is checked, selected or not, before the first one is read."""
    if archive.is_symlink():
        raise _refuse(archive.parent, archive.name, "is a symbolic link")
    if archive.is_dir():
        yield from _dir_members(archive, include, exclude)
    elif tarfile.is_tarfile(archive):
        yield from _tar_members(archive, include, exclude)
    elif zipfile.is_zipfile(archive):
        yield from _zip_members(archive, include, exclude)
    elif _selected(archive.name, include, exclude):
        yield archive.name, archive.read_bytes()


def _dir_members(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    bad = tree_problem(archive)
    if bad is not None:
        raise _refuse(archive, *bad)
    files = {p.relative_to(archive).as_posix(): p for p in archive.rglob("*") if p.is_file()}
    for name in sorted(files):
        if _selected(name, include, exclude):
            yield name, files[name].read_bytes()


def _tar_members(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(archive) as tf:
        infos = []
        try:
            for m in tf:  # header by header: a bad one is refused before its data is even skipped
                why = tar_problem(m)
                if why is not None:
                    raise _refuse(archive, m.name, why)
                if m.isfile():
                    infos.append(m)
        except tarfile.TarError as e:
            raise StageError(f"{shown(archive)}: not a readable tar archive ({e}); fetch it again") from None
        for m in sorted(infos, key=lambda m: m.name):
            if _selected(m.name, include, exclude):
                f = tf.extractfile(m)
                if f is None:
                    raise StageError(f"{shown(archive)}: cannot read member {m.name}")
                yield m.name, f.read()


def _zip_members(archive: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            why = zip_problem(info)
            if why is not None:
                raise _refuse(archive, info.filename, why)
        for info in sorted((i for i in infos if not i.is_dir()), key=lambda i: i.filename):
            if _selected(info.filename, include, exclude):
                try:
                    data = zf.read(info)
                except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # e.g. more bytes than it declared
                    raise StageError(f"{shown(archive)}: member {info.filename!r} is corrupt ({e}); "
                                     "refusing the archive; fetch it again") from None
                yield info.filename, data
