"""Read members of a raw archive (tar, zip, a directory or a single file) by glob."""

from __future__ import annotations

import fnmatch
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from marin.errors import StageError


def _selected(name: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in include) and not any(
        fnmatch.fnmatchcase(name, p) for p in exclude
    )


def members(
    archive: Path, include: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> Iterator[tuple[str, bytes]]:
    """(member path, bytes) of every selected regular file, sorted by path."""
    if archive.is_dir():
        files = {p.relative_to(archive).as_posix(): p for p in archive.rglob("*") if p.is_file()}
        for name in sorted(files):
            if _selected(name, include, exclude):
                yield name, files[name].read_bytes()
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            infos = sorted((m for m in tf.getmembers() if m.isfile()), key=lambda m: m.name)
            for m in infos:
                if _selected(m.name, include, exclude):
                    f = tf.extractfile(m)
                    if f is None:
                        raise StageError(f"{archive}: cannot read member {m.name}")
                    yield m.name, f.read()
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name in sorted(n for n in zf.namelist() if not n.endswith("/")):
                if _selected(name, include, exclude):
                    yield name, zf.read(name)
    elif _selected(archive.name, include, exclude):
        yield archive.name, archive.read_bytes()
