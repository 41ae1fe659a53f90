"""Directory listings too long to inline in an output record: ``ledger/listings/<hex>.jsonl``.

A directory's digest is the sha256 of the RFC 8785 JSON array of its entries
``{"digest", "path", "size"}``. A listing file holds the same entries, one canonical JSON
object per line, and is named by that digest: ``"[" + ",".join(lines) + "]"`` hashes to it,
so the file needs no digest of its own and is checked while it is streamed. Committed with
the ledger, it keeps every file of any size of output named.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, readers
from marin.errors import IntegrityError

LISTINGS = Path("ledger") / "listings"


def listing_path(digest: str) -> Path:
    return LISTINGS / f"{digest.removeprefix(hashing.PREFIX)}.jsonl"


def write(root: Path, entries: list[dict[str, Any]], digest: str) -> str:
    """Write the listing of a directory whose tree digest is ``digest``; returns its project path."""
    rel = listing_path(digest)
    lines = [hashing.canonical_json(e) for e in entries]
    if hashing.bytes_digest(b"[" + b",".join(lines) + b"]") != digest:
        raise IntegrityError(f"the listing of {len(entries)} entries does not hash to {digest}")
    if not (root / rel).is_file():  # named by its content: an existing one is the same bytes
        fsutil.write_bytes(root / rel, b"".join(line + b"\n" for line in lines))
    return rel.as_posix()


def entries(root: Path, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The files of a recorded directory output, inline or streamed from its listing (checked)."""
    if "entries" in body:
        yield from body["entries"]
        return
    if "listing" not in body:
        return
    import json

    path, h, first = root / body["listing"], hashlib.sha256(b"["), True
    try:
        for line in readers.lines(path, "listing", IntegrityError):
            h.update((b"" if first else b",") + line.rstrip(b"\n"))
            first = False
            yield json.loads(line)
    except FileNotFoundError:
        raise IntegrityError(f"{body['listing']}: the listing of {body['path']} is missing; "
                             "restore ledger/listings/ from git") from None
    h.update(b"]")
    if hashing.fmt(h.digest()) != body["digest"]:
        raise IntegrityError(f"{body['listing']}: does not hash to {body['digest']} (the listing was edited)")
