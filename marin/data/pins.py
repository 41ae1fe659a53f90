"""``marin pin``: the sha256 that :func:`marin.data.sources.fetch` will compute for a locator, computed
the same way (local data in place, with fetch's checks; a download to a temporary file), and a
params.yaml snippet naming it."""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from marin import hashing, net
from marin.config import NetworkParams, Source
from marin.data import archive
from marin.data.bounds import zip_directory
from marin.data.sources import (
    KINDS,
    MAGIC,
    Mismatch,
    digest_of,
    glob_files,
    local_dir,
    local_file,
    obtain,
    pip_download,
)
from marin.errors import FetchError

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # schemas/params.schema.json $defs/name
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
    what = archive.kind(path)
    if what == "tar":
        return tuple(archive.tar_names(path)), True  # bounded streams: no spin on a run of zeros
    if what == "zip":
        zip_directory(path)  # before zipfile builds an object per entry
        with zipfile.ZipFile(path) as zf:
            return tuple(sorted(n for n in zf.namelist() if not n.endswith("/"))), True
    return (path.name,), False


def _pip_digest(source: Source, tmp: Path, bounds: NetworkParams) -> str:
    """The sha256 hex of the sdist pip downloads for ``source``, asked with a placeholder hash."""
    probe = tmp / "probe"
    probe.mkdir()
    try:
        pip_download(source, probe, bounds)
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
    if kind == "url" and (problem := net.scheme_problem(locator)):  # file:///dev/zero would never end
        raise FetchError(f"{locator[:200]}: {problem}")
    source = Source(name=name, kind=kind, locator=locator, sha256="0" * 64, license="NOASSERTION", extract=())
    if kind == "local":
        d = hashing.digest_path(local_dir(source, root))
        return Pin(kind, locator, d.digest, d.size, tuple(e[0] for e in d.entries or ()), True)
    if kind == "glob":  # the tree digest of the directory fetch writes (hashing.dir_digest), without copying
        base, files = glob_files(source, root)
        entries = [{"path": r, "digest": hashing.file_digest(base / r), "size": (base / r).stat().st_size}
                   for r in files]
        return Pin(kind, locator, hashing.json_digest(entries), sum(e["size"] for e in entries), tuple(files), True)
    if kind == "file":
        src = local_file(source, root)
        members = _members(src)  # first: a file that lies about its type is refused before it is read whole
        return Pin(kind, locator, hashing.file_digest(src), src.stat().st_size, *members)
    bounds = net.settings(root)
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "dl"
        dest.mkdir()
        if kind == "pypi":
            source = replace(source, sha256=_pip_digest(source, Path(tmp), bounds))
        got = obtain(source, dest, root, bounds)
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
    if MAGIC.search(target):
        return "glob"
    raise FetchError(f"{target}: no such file or directory, and not a glob, an http(s) URL or "
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
                 if p not in ("", ".", "..") and not MAGIC.search(p)]
        stem = parts[-1].split(".")[0] if parts else ""
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")[:64]
    return name if _NAME.match(name) else "corpus"
