"""Pinned raw sources: a registry package by exact version (``pypi``), an http(s) URL
(``url``; a ``file:`` address is refused: local data has its own kinds), or local data: a
directory (``local``), one file (``file``) or the files a glob matches (``glob``). Every
archive is checked against its pinned sha256 before anything downstream may read it;
:func:`marin.data.pins.pin` computes that sha256 the way :func:`fetch` will."""

from __future__ import annotations

import glob
import os
import re
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from marin import hashing, net, pipfloor
from marin.config import NetworkParams, Source
from marin.data.archive import file_problem, tree_problem
from marin.errors import FetchError

KINDS = ("pypi", "url", "local", "file", "glob")
LOCAL_KINDS = ("local", "file", "glob")  # read from this machine again on every fetch
MAGIC = re.compile(r"[*?[]")


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


def pin_command(source: Source) -> str:
    """The ``marin pin`` command line that prints the current pin of ``source``."""
    target = f"pypi:{source.locator}" if source.kind == "pypi" else source.locator
    return f"uv run marin pin {shlex.quote(target)} --name {source.name} --kind {source.kind}"


class Mismatch(FetchError):
    """A source's data does not have the sha256 that params.yaml pins."""

    def __init__(self, source: Source, got: str) -> None:
        super().__init__(
            f"fetch.sources[{source.name}]: sha256 mismatch for {source.kind}:{source.locator}: params.yaml "
            f"pins {_expected(source)}, the data is {got}; if the new data is trusted, run "
            f"`{pin_command(source)}` (from the project root) and update the pinned sha256 in params.yaml"
        )
        self.source, self.got = source, got


def failed(errors: Sequence[FetchError], total: int) -> FetchError:
    """One error for all sources that failed in a run: the count, then one line per source."""
    head = f"fetch: {len(errors)} of {total} source(s) failed; data/raw was left unchanged"
    if len(errors) == 1:
        return FetchError(f"{head}: {errors[0]}")
    return FetchError(head + ":\n" + "\n".join(f"  {e}" for e in errors))


def _file_cap(n: int) -> Callable[[], None]:
    """For a child process: no file it writes may pass ``n`` bytes (RLIMIT_FSIZE; SIGXFSZ past it)."""
    def cap() -> None:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        limit = n if hard == resource.RLIM_INFINITY else min(n, hard)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return cap


def pip_download(source: Source, dest: Path, bounds: NetworkParams = net.DEFAULT) -> Path:
    """Download a source distribution with pip, which itself checks the pinned hash."""
    req = dest.parent / f"{source.name}.requirements.txt"
    req.write_text(f"{source.locator} --hash=sha256:{source.sha256}\n")
    cmd = [
        *pipfloor.command(bounds), "download", "--no-deps", "--no-binary", ":all:",
        "--require-hashes", "--disable-pip-version-check", "-q", *net.pip_args(bounds), "-r", str(req),
        "-d", str(dest),
    ]
    try:  # pip's own --timeout and --retries bound each request; the deadline and the file size cap, the whole
        with tempfile.TemporaryDirectory(prefix="pip-") as tmp:  # pip's own files, even when the floor ends it
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=bounds.total_timeout_s,
                                  preexec_fn=_file_cap(bounds.max_bytes), env={**os.environ, "TMPDIR": tmp})
    except subprocess.TimeoutExpired:
        raise FetchError(f"fetch.sources[{source.name}]: pip download of {source.locator} not finished within "
                         f"network.total_timeout_s ({bounds.total_timeout_s:g} s); raise it in params.yaml") from None
    if proc.returncode == pipfloor.SLOW:
        raise FetchError(f"fetch.sources[{source.name}]: pip download of {source.locator} from "
                         f"{pipfloor.slow_line(proc.stderr)}")
    if proc.returncode == -signal.SIGXFSZ:  # the kernel stopped a write past the cap
        raise FetchError(f"fetch.sources[{source.name}]: pip download of {source.locator} wrote more than "
                         f"network.max_bytes ({bounds.max_bytes} bytes); raise it in params.yaml if it is that big")
    if proc.returncode != 0:
        got = re.search(r"Got\s+([0-9a-f]{64})", proc.stderr)
        if got:
            raise Mismatch(source, "sha256:" + got.group(1))
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        raise FetchError(
            f"fetch.sources[{source.name}]: pip could not download {source.locator}: {tail}"
        )
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise FetchError(f"fetch.sources[{source.name}]: expected one archive from pip, got {files}")
    return files[0]


def _url_download(source: Source, dest: Path, bounds: NetworkParams) -> Path:
    name = Path(urllib.request.url2pathname(source.locator.split("?")[0])).name or source.name
    out = dest / name
    try:
        net.download(source.locator, out, bounds, what=f"fetch.sources[{source.name}]: cannot download ")
    except net.NetworkError as e:
        raise FetchError(str(e)) from None
    except OSError as e:  # a file:// URL that is not there, a full disk
        raise FetchError(f"fetch.sources[{source.name}]: cannot download {source.locator}: {e}") from None
    return out


# -- local data: a directory, a file, a glob ----------------------------------------------


def _local_path(source: Source, root: Path) -> Path:
    p = Path(source.locator)
    return p if p.is_absolute() else root / p


def _refuse_local(source: Source, path: Path, why: str) -> FetchError:
    return FetchError(
        f"fetch.sources[{source.name}]: {path} {why}; refusing the local source (nothing "
        "was copied); replace it by a regular file or remove it, then pin the new sha256 in params.yaml"
    )


def _not_plain(path: Path) -> str | None:
    """Why ``path`` (not followed if a link) is not a regular file on a disk, or None."""
    if stat.S_ISDIR(path.lstat().st_mode):
        return "is a directory"
    return file_problem(path)


def local_dir(source: Source, root: Path) -> Path:
    src = _local_path(source, root)
    if not src.is_dir():
        raise FetchError(f"fetch.sources[{source.name}]: local directory {src} does not exist")
    why = file_problem(src.resolve())  # the directory may be reached through a link; never /proc
    if why is not None:
        raise _refuse_local(source, src, why)
    bad = tree_problem(src)
    if bad is not None:  # copytree would follow a link and copy what it points to
        raise _refuse_local(source, src / bad[0], bad[1])
    return src


def local_file(source: Source, root: Path) -> Path:
    src = _local_path(source, root)
    if not src.exists() and not src.is_symlink():
        raise FetchError(f"fetch.sources[{source.name}]: local file {src} does not exist")
    why = _not_plain(src)
    if why == "is a directory":
        raise FetchError(f"fetch.sources[{source.name}]: {src} is a directory; use kind: local for a directory")
    if why is not None:
        raise _refuse_local(source, src, why)
    return src


def _glob_base(source: Source, root: Path) -> tuple[Path, str]:
    """(the pattern up to its first component with a wildcard, the rest of the pattern)."""
    parts = _local_path(source, root).parts
    i = next((k for k, part in enumerate(parts) if MAGIC.search(part)), len(parts) - 1)
    return Path(*parts[:i]), "/".join(parts[i:])


def tracked_paths(sources: Sequence[Source], root: Path) -> list[str]:
    """Project-relative paths of the local sources that lie inside the project (a glob: its base
    directory). Where git tracks them, an uncommitted change there makes the fetch run dirty
    (``env.code_state``): the commit would not give a replay the same data."""
    top = os.path.abspath(root)
    out = []
    for source in sources:
        if source.kind not in LOCAL_KINDS:
            continue
        p = _glob_base(source, root)[0] if source.kind == "glob" else _local_path(source, root)
        rel = os.path.relpath(os.path.abspath(p), top)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            out.append(Path(rel).as_posix())
    return out


def glob_files(source: Source, root: Path) -> tuple[Path, list[str]]:
    """(base directory, sorted relative paths) of the regular files the pattern of ``source`` matches.

    The base is the pattern up to its first component with a wildcard (``*``, ``?``, ``[``);
    ``**`` spans directories and ``*`` does not match a leading dot, as in the shell. Matched
    directories are skipped; a matched link or special file, or a match below a linked
    directory, is refused. No match at all is an error naming the pattern.
    """
    base, rest = _glob_base(source, root)
    files = []
    for rel in sorted(set(glob.glob(rest, root_dir=base, recursive=True)) - {""}):
        parts_rel = Path(rel).parts
        for k in range(1, len(parts_rel) + 1):  # every directory on the way: a link is refused, not followed
            why = _not_plain(base.joinpath(*parts_rel[:k]))
            if why is not None and why != "is a directory":
                raise _refuse_local(source, base.joinpath(*parts_rel[:k]), why)
        if not (base / rel).is_dir():
            files.append(Path(rel).as_posix())
    if not files:
        raise FetchError(
            f"fetch.sources[{source.name}]: the glob {source.locator!r} matches no file (looked in {base}); "
            "check the pattern (a relative one is read from the project root)"
        )
    return base, files


def _local_copy(source: Source, dest: Path, root: Path) -> Path:
    src = local_dir(source, root)
    out = dest / src.name
    shutil.copytree(src, out)
    return out


def _file_copy(source: Source, dest: Path, root: Path) -> Path:
    src = local_file(source, root)
    out = dest / src.name
    shutil.copy2(src, out, follow_symlinks=False)
    return out


def _glob_copy(source: Source, dest: Path, root: Path) -> Path:
    base, files = glob_files(source, root)
    out = dest / source.name  # one directory named after the source, the files at their relative paths
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(base / rel, out / rel, follow_symlinks=False)
    return out


def obtain(source: Source, dest: Path, root: Path, bounds: NetworkParams = net.DEFAULT) -> Path:
    """Download or copy ``source`` into ``dest``, unchecked; downloads within ``bounds``."""
    if source.kind == "pypi":
        return pip_download(source, dest, bounds)
    if source.kind == "url":
        return _url_download(source, dest, bounds)
    copy = {"local": _local_copy, "file": _file_copy, "glob": _glob_copy}[source.kind]
    return copy(source, dest, root)


def fetch(source: Source, dest: Path, root: Path, cached: Path | None = None,
          bounds: NetworkParams = net.DEFAULT) -> Path:
    """Place the verified archive of ``source`` under ``dest`` (an empty directory).

    A downloaded archive fetched before with the pinned digest is reused without network;
    local data is read again each time, so a changed file is a mismatch, never the old copy.
    """
    if (source.kind not in LOCAL_KINDS and cached is not None and cached.exists()
            and digest_of(cached) == _expected(source)):
        target = dest / cached.name
        if cached.is_dir():
            shutil.copytree(cached, target)
        else:
            shutil.copy2(cached, target)
        return target
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmp_dir = Path(tmp) / "dl"
        tmp_dir.mkdir()
        got = obtain(source, tmp_dir, root, bounds)
        digest = digest_of(got)
        if digest != _expected(source):
            raise Mismatch(source, digest)
        target = dest / got.name
        os.replace(got, target)
    return target
