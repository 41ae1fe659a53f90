"""Content digests: bytes, files, directories, canonical JSON (RFC 8785), array pytrees.

Every digest is printed as ``sha256:<hex>``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

from marin.errors import IntegrityError
from marin.filetree import tree_problem
from marin.fsutil import open_regular, shown

PREFIX = "sha256:"
_CHUNK = 1 << 20


def fmt(raw: bytes) -> str:
    """Format a raw 32-byte sha256 digest as ``sha256:<hex>``."""
    return PREFIX + raw.hex()


def parse(digest: str) -> bytes:
    """Raw bytes of a ``sha256:<hex>`` digest."""
    if not digest.startswith(PREFIX) or len(digest) != len(PREFIX) + 64:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return bytes.fromhex(digest[len(PREFIX):])


def bytes_digest(data: bytes) -> str:
    return fmt(hashlib.sha256(data).digest())


def canonical_json(obj: Any) -> bytes:
    """RFC 8785 (JSON Canonicalization Scheme) bytes of ``obj``."""
    return rfc8785.dumps(obj)


def json_digest(obj: object) -> str:
    """sha256 over the RFC 8785 canonical form of ``obj``."""
    return bytes_digest(canonical_json(obj))


class ChangedWhileRead(IntegrityError):
    """A file's size or times moved while it was hashed: the digest is of no version of it."""


def unchanged(path: str | os.PathLike[str], before: os.stat_result, after: os.stat_result) -> None:
    """Raise ChangedWhileRead unless the file's size, mtime and ctime are the same ``after`` a read as
    ``before`` it (so the digest just computed is the file's digest when it was read)."""
    if (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (after.st_size, after.st_mtime_ns,
                                                                      after.st_ctime_ns):
        return
    moved = f"size {before.st_size:,} -> {after.st_size:,} bytes" if before.st_size != after.st_size else \
        f"modified {(after.st_mtime_ns - before.st_mtime_ns) / 1e9:+.3f} s later"
    raise ChangedWhileRead(f"{shown(path)}: changed while it was read ({moved}); its digest would not be the "
                           "file's: wait until nothing writes to it, then run again")


def file_digest(path: str | os.PathLike[str], *, follow: bool = True) -> str:
    """sha256 of a file's bytes, streamed; ChangedWhileRead if the file changed meanwhile. A link is
    followed unless ``follow`` is False (then it is an OSError, as a fifo is)."""
    with open_regular(path, follow=follow) as f:  # a fifo would block the digest forever
        before = os.fstat(f.fileno())
        digest = fmt(hashlib.file_digest(f, "sha256").digest())
        unchanged(path, before, os.fstat(f.fileno()))
    return digest


def file_digests(path: str | os.PathLike[str]) -> tuple[str, str, int]:
    """(sha256 ``sha256:<hex>``, DVC's md5 hex, size) of a file, read once for both;
    ChangedWhileRead if the file changed meanwhile."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    with open_regular(path, follow=True) as f:  # a fifo would block the digest forever
        before = os.fstat(f.fileno())
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
        unchanged(path, before, os.fstat(f.fileno()))
    return fmt(sha.digest()), md5.hexdigest(), size


@dataclass(frozen=True)
class PathDigest:
    """Everything the ledger records about a file or directory's content, from one read of it."""

    digest: str  # sha256 of a file, or the tree digest of a directory (``dir_digest``)
    dvc_md5: str  # what DVC writes into dvc.lock
    size: int
    entries: tuple[tuple[str, str, int], ...] | None  # (relpath, sha256, size) of each file of a directory


FileHashes = Callable[[Path], tuple[str, str, int]]


def digest_path(path: str | os.PathLike[str], file_hashes: FileHashes | None = None) -> PathDigest:
    """sha256, DVC md5 and size of ``path`` with each file read once (``file_hashes`` may cache them);
    a folder's entries as :func:`tree_files` (with links to files)."""
    p, fh = Path(path), file_hashes or file_digests
    if not p.is_dir():
        sha, md5, size = fh(p)
        return PathDigest(sha, md5, size, None)
    files = tree_files(p, links=True)
    hashed = [(rel, *fh(f)) for rel, f in files]
    entries = tuple((rel, sha, size) for rel, sha, _, size in hashed)
    digest = json_digest([{"path": r, "digest": d, "size": s} for r, d, s in entries])
    blob = json.dumps([{"md5": md5, "relpath": rel} for rel, _, md5, _ in hashed], sort_keys=True)
    return PathDigest(digest, hashlib.md5(blob.encode("utf-8")).hexdigest() + ".dir",
                      sum(s for _, _, s in entries), entries)


class NotPlain(IntegrityError):
    """A hashed folder holds an entry that is not a regular file or folder: no digest leaves it out."""


def tree_files(root: Path, *, links: bool) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every file under the folder ``root``, sorted; NotPlain naming the
    first entry that is a fifo, socket, device or kernel pseudo-file, or a link (unless ``links``: then
    a link to a regular file counts as that file, as a DVC checkout's link to its cache does)."""
    bad = tree_problem(root, links=links)
    if bad is not None:
        raise NotPlain(f"{shown(root / bad[0])}: {bad[1]}; a folder's digest covers every entry, and this one "
                       "has no bytes of its own to hash: remove it, or put a regular file there")
    return sorted((f.relative_to(root).as_posix(), f) for f in root.rglob("*") if f.is_file())


def dir_entries(path: str | os.PathLike[str], *, links: bool = True) -> list[tuple[str, str, int]]:
    """(relative posix path, file digest, size) of every file under ``path``, sorted; an entry that is
    not a regular file or folder is NotPlain (:func:`tree_files`), never skipped."""
    out = []
    for rel, p in tree_files(Path(path), links=links):
        try:
            out.append((rel, file_digest(p, follow=links), p.stat().st_size))
        except OSError as e:  # replaced by a link or a fifo since the walk
            raise NotPlain(f"{shown(p)}: {e.strerror or e}; it changed while the folder was hashed") from None
    return out


def dir_digest(path: str | os.PathLike[str], *, links: bool = True) -> str:
    """Digest of a directory tree: canonical JSON of its sorted (path, digest, size) list.

    Independent of mtimes, permissions and file-system order. ``links``: as :func:`dir_entries`.
    """
    entries = [{"path": p, "digest": d, "size": s} for p, d, s in dir_entries(path, links=links)]
    return json_digest(entries)


def path_digest(path: str | os.PathLike[str]) -> str:
    """File digest for a file, tree digest for a directory."""
    return dir_digest(path) if Path(path).is_dir() else file_digest(path)


def path_size(path: str | os.PathLike[str]) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for _, f in tree_files(p, links=True))
    return p.stat().st_size


def files_digest(root: str | os.PathLike[str], paths: Iterable[str]) -> str:
    """Digest over named files below ``root`` (relative paths), e.g. the code of a stage."""
    root = Path(root)
    return files_map_digest({rel: file_digest(root / rel) for rel in set(paths) if (root / rel).is_file()})


def files_map_digest(digests: Mapping[str, str]) -> str:
    """:func:`files_digest` from recorded ``{relative path: file digest}``."""
    return json_digest([{"path": rel, "digest": digests[rel]} for rel in sorted(digests)])


def tree_digest(leaves: Mapping[str, Any]) -> str:
    """Digest over named arrays: each leaf contributes (path, dtype, shape, raw bytes).

    ``leaves`` maps a leaf path (e.g. ``params/layers/0/attn/wq``) to an array-like with
    ``dtype``, ``shape`` and ``tobytes()`` (numpy). Order-independent in the mapping,
    sensitive to every bit of every tensor.
    """
    h = hashlib.sha256()
    for name in sorted(leaves):
        arr = leaves[name]
        header = canonical_json({"path": name, "dtype": str(arr.dtype), "shape": list(arr.shape)})
        data = arr.tobytes()
        h.update(len(header).to_bytes(8, "big") + header)
        h.update(len(data).to_bytes(8, "big") + data)
    return fmt(h.digest())


def dvc_md5(path: str | os.PathLike[str]) -> str:
    """The md5 DVC 3 writes into dvc.lock for ``path``.

    A file: md5 of its bytes. A directory: md5 of ``json.dumps(entries, sort_keys=True)``
    over its files' ``{"md5", "relpath"}`` sorted by relpath, with ``.dir`` appended
    (checked against a real ``dvc repro``; see tests/test_hashing.py).
    """
    p = Path(path)
    if not p.is_dir():
        with open_regular(p, follow=True) as f:
            return hashlib.file_digest(f, "md5").hexdigest()
    entries = []
    for rel, f in tree_files(p, links=True):
        with open_regular(f, follow=True) as fh:
            entries.append({"md5": hashlib.file_digest(fh, "md5").hexdigest(),
                            "relpath": rel})
    blob = json.dumps(entries, sort_keys=True).encode("utf-8")
    return hashlib.md5(blob).hexdigest() + ".dir"
