"""Manifests: validated against schemas/manifest/<kind>.schema.json, written stably.

A manifest with one long list (curate's ``removed``: one entry per removed document) is
written as it grows (:class:`ListSpool`, :func:`write_streamed`): the bytes are exactly
those of :func:`dumps` of the whole object, and every entry is validated, in batches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from marin import fsutil, readers, schemas
from marin.errors import StageError

BATCH = 1024  # list entries validated at a time


def dumps(obj: object) -> bytes:
    """Stable, human-readable JSON (sorted keys, fixed indent, trailing newline)."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write(obj: dict[str, Any], path: Path) -> None:
    schemas.validate(obj, f"manifest/{obj['kind']}", f"manifest {path}")
    fsutil.write_bytes(path, dumps(obj))


def read(path: Path, kind: str) -> dict[str, Any]:
    obj = readers.read_json(path, "manifest", StageError)
    schemas.validate(obj, f"manifest/{kind}", f"manifest {path}")
    return obj


class ListSpool:
    """The entries of the top-level list ``key`` of a manifest, formatted into ``path`` as
    they come; each batch is validated as that list of ``skeleton`` (any valid manifest)."""

    def __init__(self, path: Path, key: str, skeleton: dict[str, Any]):
        self.path, self.key, self.skeleton = path, key, skeleton
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.n = 0
        self.batch: list[Any] = []

    def add(self, entry: Any) -> None:
        self.batch.append(entry)
        if len(self.batch) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        obj = {**self.skeleton, self.key: self.batch}
        schemas.validate(obj, f"manifest/{obj['kind']}", f"manifest {self.path.name}, {self.key}[{self.n}:]")
        for entry in self.batch:
            # json.dumps(indent=2) puts a top-level list's entries 4 spaces in
            text = json.dumps(entry, indent=2, sort_keys=True, ensure_ascii=False).replace("\n", "\n    ")
            self.file.write(("    " if self.n == 0 else ",\n    ") + text)
            self.n += 1
        self.batch = []

    def close(self) -> None:
        self._flush()
        self.file.close()


def write_streamed(obj: dict[str, Any], spool: ListSpool, path: Path) -> None:
    """Validate ``obj`` (its ``spool.key`` list empty) and write it with the spooled entries in
    that list: the same bytes as :func:`dumps` of the whole object. ``path`` lies inside a
    staged output directory (it is written in place)."""
    assert obj[spool.key] == [], f"{spool.key} comes from the spool"
    schemas.validate(obj, f"manifest/{obj['kind']}", f"manifest {path}")
    spool.close()
    text = dumps(obj).decode()
    marker = f'\n  "{spool.key}": []'  # the only line at this indent with this key: top-level keys are unique
    head, sep, tail = text.partition(marker)
    assert sep and marker not in tail
    with open(path, "w", encoding="utf-8") as out:
        if spool.n == 0:
            out.write(text)
            return
        out.write(f'{head}\n  "{spool.key}": [\n')
        with open(spool.path, encoding="utf-8") as f:
            shutil.copyfileobj(f, out, 1 << 20)
        out.write(f"\n  ]{tail}")


class Funnel:
    """Documents and bytes per corpus: in, removed per step (by reason), kept, per split;
    and the same per step over all corpora (in, removed, out). Bytes in and removed are the
    documents' bytes as read from the archive; kept and the splits' are the stored (stripped,
    normalized) text's, and ``kept_raw`` the kept documents' bytes as read: in = removed + kept_raw."""

    def __init__(self, steps: tuple[str, ...]):
        self.steps = steps
        self.per: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, dict[str, str]] = {}  # corpus -> source, license

    def _corpus(self, corpus: str) -> dict[str, Any]:
        c = self.per.get(corpus)
        if c is None:
            def zero() -> dict[str, int]:
                return {"docs": 0, "bytes": 0}
            c = self.per[corpus] = {"in": zero(), "removed": {s: zero() for s in self.steps}, "kept": zero(),
                                    "kept_raw": zero(), "train": zero(), "validation": zero()}
        return c

    @staticmethod
    def _count(c: dict[str, int], n_bytes: int) -> None:
        c["docs"] += 1
        c["bytes"] += n_bytes

    def doc_in(self, corpus: str, n_bytes: int) -> None:
        self._count(self._corpus(corpus)["in"], n_bytes)

    def removed(self, corpus: str, step: str, n_bytes: int) -> None:
        self._count(self._corpus(corpus)["removed"][step], n_bytes)

    def kept(self, corpus: str, split: str, n_bytes: int, raw_bytes: int) -> None:
        c = self._corpus(corpus)
        for k in ("kept", split):
            self._count(c[k], n_bytes)
        self._count(c["kept_raw"], raw_bytes)

    def as_dict(self) -> dict[str, Any]:
        live = {"docs": sum(c["in"]["docs"] for c in self.per.values()),
                "bytes": sum(c["in"]["bytes"] for c in self.per.values())}
        steps = []
        for s in self.steps:
            rem = {"docs": sum(c["removed"][s]["docs"] for c in self.per.values()),
                   "bytes": sum(c["removed"][s]["bytes"] for c in self.per.values())}
            out = {"docs": live["docs"] - rem["docs"], "bytes": live["bytes"] - rem["bytes"]}
            steps.append({"step": s, "in": live, "removed": rem, "out": out})
            live = out
        corpora = {c: {**self.meta.get(c, {}), **v} for c, v in sorted(self.per.items())}
        return {"corpora": corpora, "steps": steps}
