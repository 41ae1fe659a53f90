"""Curation: documents from raw archives → normalized, filtered, deduplicated, split.

Documents are natural units: a play, a poem, a Milton work, a Bible chapter. The work is
cut into shards by input only (:mod:`marin.data.shards`: a bundle of whole text members, a
line-aligned chunk of a JSONL member, a batch of Parquet rows), never by worker.
:func:`process_shard` (decode, normalize, filter, exact digest, MinHash signature) runs on
the data engine; the driver
runs the global steps over the results in shard order (:class:`Curation`): exact dedup and
near dedup (the first document in the fixed order wins), the split, the Parquet row groups
and the manifest's removed list. So the outputs are the same for any engine and worker
count, and memory holds a few shards, the open row groups and the dedup indexes' bounded
in-memory part, never the corpus. The funnel (documents and bytes in, removed per step
with the reason, kept) is counted per corpus and per step for the manifest.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from marin import hashing
from marin.config import CurateParams, Source
from marin.config_data import Normalization
from marin.data import dedup, filters, manifest, parquet
from marin.data.engine import Engine
from marin.data.shards import Origin, Oversize, Shard, oversize, read_records, shards
from marin.errors import StageError
from marin.progress import bar

SPLITS = ("train", "validation")
STEPS = ("oversize", "utf8", "empty", *(n for n, _ in filters.RULES), "exact_dedup", "near_dedup")
SCHEMA = pa.schema([("doc_id", pa.string()), ("corpus", pa.string()), ("source", pa.string()),
                    ("name", pa.string()), ("license", pa.string()), ("n_bytes", pa.int64()),
                    ("text", pa.string())])
# dictionaries for the few-valued columns; 64 documents (~1 MB) encoded at a time; zstd level 1:
# the driver writes every row, and level 3 compresses text at a third of the speed (57 vs 168 MB/s
# measured) for files 10% smaller
PARQUET = parquet.settings(("corpus", "source", "license"), 64, 1)


@dataclass(frozen=True)
class Outcome:
    """One document after the per-shard steps."""

    origin: Origin
    name: str  # member path, or member path + '#' + line, row or group key
    license: str
    raw_bytes: int  # before normalization
    step: str | None  # the removal step (utf8, empty, a filter), or None: a candidate
    detail: str
    doc_id: str | None
    text: bytes | None = None  # normalized UTF-8 (candidates)
    sig: np.ndarray | None = None  # MinHash values (candidates, when near dedup is on)
    group: tuple[int, str, int] | None = None  # (stream, repr(key), first line) of grouped records


@dataclass
class Part:
    """Consecutive records with one group key at a shard's edge: the group may go on in the next shard."""

    where: str  # archive: member, for errors
    origin: Origin
    stream: int
    member: str
    key: tuple[Any, ...]
    license: str | None  # the records' own, if any
    line: int
    texts: list[str] = field(default_factory=list)
    size: int = 0  # UTF-8 bytes of the texts (past the cap: at least; they are no longer held)
    over: bool = False

    def add(self, text: str | Oversize, license: str | None, line: int, p: CurateParams) -> None:
        """One more record of the group; past ``curate.max_document_bytes`` the group is refused or
        dropped (its texts are let go)."""
        if license != self.license:
            raise StageError(f"{self.where} line {line}: license {license!r} differs from {self.license!r} of the "
                             f"records before it in group {self.key} (from line {self.line}); a document has one "
                             "license: give its records the same one")
        self.size += text.bytes if isinstance(text, Oversize) else len(text.encode())
        if not self.over and self.size > p.max_document_bytes:
            oversize(f"{self.where} group {self.key} (from line {self.line})", self.size, p)
            self.over, self.texts = True, []
        if not self.over and isinstance(text, str):  # an Oversize text is over the cap: the group is over
            self.texts.append(text)


def _decode(data: bytes) -> str:
    text = data.decode("utf-8-sig")  # strict: a bad byte is a removal, not a silent fix
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize(text: str, form: Normalization) -> str:
    text = text.strip()
    return text if form == "none" else unicodedata.normalize(form, text)


def split_of(doc_id: str, salt: str, validation_fraction: float) -> str:
    """Deterministic split: a keyed hash of the document digest, compared to the fraction."""
    h = hashlib.sha256(f"{salt}\0{doc_id}".encode()).digest()
    return "validation" if int.from_bytes(h[:8], "big") / 2**64 < validation_fraction else "train"


def judge(origin: Origin, name: str, license: str, text: str | Oversize, p: CurateParams,
          group: tuple[int, str, int] | None = None) -> Outcome:
    """Normalize, check emptiness and the filters, digest, and sign (MinHash) one document;
    one over ``curate.max_document_bytes`` (an :class:`Oversize`, never read) is removed."""
    if isinstance(text, Oversize):
        return Outcome(origin, name, license, text.bytes, "oversize",
                       f"{text.bytes:,} bytes or more, over curate.max_document_bytes ({p.max_document_bytes:,})",
                       None, group=group)
    raw = len(text.encode())
    norm = normalize(text, p.normalization)
    data = norm.encode()
    doc_id = hashing.bytes_digest(data)
    why = filters.first_failure(filters.stats(norm), p.filters) if norm else ("empty", "no text after normalization")
    if why is not None:
        return Outcome(origin, name, license, raw, why[0], why[1], doc_id, group=group)
    sig = dedup.signature(norm, p.dedup.near) if p.dedup.near.enabled else None
    return Outcome(origin, name, license, raw, None, "", doc_id, data, sig, group)


def finish(part: Part, p: CurateParams) -> Outcome:
    """The document of a complete group of records."""
    name = f"{part.member}#{' '.join(str(k) for k in part.key)}"
    text = Oversize(part.size) if part.over else "\n".join(part.texts)
    return judge(part.origin, name, part.license or part.origin.license, text, p,
                 (part.stream, repr(part.key), part.line))


# -- per shard, on the engine -------------------------------------------------------------

def process_shard(sh: Shard) -> list[Outcome | Part]:
    """The per-shard steps over one shard's documents, in order. Groups of records at the
    shard's two edges come back as Parts for the driver to join with its neighbours'."""
    if sh.ex.format == "text":
        return [_text_doc(sh.origin, name, data, sh.p) for name, data in sh.data]
    records = read_records(sh)
    if not sh.ex.group_by or isinstance(sh.data, Oversize):  # a line skipped unread: a document of its own
        return [judge(sh.origin, f"{sh.member}#{n}", lic or sh.origin.license, text, sh.p)
                for n, _, text, lic in records]
    parts: list[Part] = []
    for n, key, text, lic in records:
        if not (parts and parts[-1].key == key):
            parts.append(Part(f"{sh.archive}: member {sh.member!r}", sh.origin, sh.stream, sh.member, key, lic, n))
        parts[-1].add(text, lic, n, sh.p)
    if len(parts) <= 2:
        return list(parts)
    return [parts[0], *(finish(x, sh.p) for x in parts[1:-1]), parts[-1]]


def _text_doc(origin: Origin, name: str, data: bytes | Oversize, p: CurateParams) -> Outcome:
    if isinstance(data, Oversize):
        return judge(origin, name, origin.license, data, p)
    try:
        text = _decode(data)
    except UnicodeDecodeError as e:
        return Outcome(origin, name, origin.license, len(data), "utf8", f"not UTF-8 at byte {e.start}", None)
    return judge(origin, name, origin.license, text, p)


def stitched(results: Iterable[list[Outcome | Part]], p: CurateParams) -> Iterator[Outcome]:
    """The documents in order: a group that a shard boundary cut is joined, then finished."""
    carry: Part | None = None
    for items in results:
        for x in items:
            if isinstance(x, Part) and carry is not None and (carry.stream, carry.key) == (x.stream, x.key):
                for t in x.texts if not x.over else [Oversize(x.size)]:
                    carry.add(t, x.license, x.line, p)
                continue
            if carry is not None:
                yield finish(carry, p)
                carry = None
            if isinstance(x, Part):
                carry = x
            else:
                yield x
    if carry is not None:
        yield finish(carry, p)


# -- the driver: the global steps --------------------------------------------------------

_SPLIT = {"file": "x.parquet", "digest": "sha256:" + "0" * 64, "docs": 0, "bytes": 0}
_SKELETON = {"kind": "curate", "params": {}, "sources": [], "funnel": {"corpora": {}, "steps": []},
             "removed": [], "splits": {"train": _SPLIT, "validation": _SPLIT}}


class Curation:
    """The global steps over documents in order: exact dedup, near dedup, the split. Kept
    documents go to their split's Parquet file a row group at a time, removed ones to the
    manifest's removed list on disk."""

    def __init__(self, p: CurateParams, out: Path, work: Path):
        self.p, self.out = p, out
        self.funnel = manifest.Funnel(STEPS)
        self.store = dedup.Store(work / "dedup.sqlite")
        self.exact = dedup.ExactIndex(self.store) if p.dedup.exact else None
        self.near = dedup.NearIndex(p.dedup.near, self.store) if p.dedup.near.enabled else None
        self.groups = dedup.ExactIndex(self.store, "groups")
        self.writers = {s: parquet.Writer(out / f"{s}.parquet", SCHEMA, spool=work, options=PARQUET) for s in SPLITS}
        self.removed = manifest.ListSpool(work / "removed.json", "removed", _SKELETON)
        self.kept = {s: [0, 0] for s in SPLITS}  # docs, bytes

    def add(self, o: Outcome) -> None:
        c = o.origin.corpus
        self.funnel.doc_in(c, o.raw_bytes)
        if o.step != "utf8":
            self.funnel.meta.setdefault(c, {"source": o.origin.source, "license": o.origin.license})
        if o.group is not None:
            self._check_group(o)
        why = (o.step, o.detail) if o.step is not None else self._duplicate(o)
        if why is not None:
            self.funnel.removed(c, why[0], o.raw_bytes)
            self.removed.add({"corpus": c, "name": o.name, "step": why[0], "detail": why[1],
                              "bytes": o.raw_bytes, "doc_id": o.doc_id})
            return
        assert o.text is not None and o.doc_id is not None
        split = split_of(o.doc_id, self.p.split.salt, self.p.split.validation_fraction)
        n = len(o.text)
        self.funnel.kept(c, split, n, o.raw_bytes)
        self.kept[split][0] += 1
        self.kept[split][1] += n
        self.writers[split].add((o.doc_id, c, o.origin.source, o.name, o.license, n, o.text), n)

    def _duplicate(self, o: Outcome) -> tuple[str, str] | None:
        assert o.doc_id is not None
        if self.exact is not None:
            first = self.exact.first(bytes.fromhex(o.doc_id.removeprefix(hashing.PREFIX)), o.name)
            if first is not None:
                return "exact_dedup", f"identical to {first}"
        if self.near is not None:
            assert o.sig is not None
            dup = self.near.add(o.name, o.sig)
            if dup is not None:
                return "near_dedup", f"estimated Jaccard {dup[1]:.3f} with {dup[0]}"
        return None

    def _check_group(self, o: Outcome) -> None:
        assert o.group is not None
        stream, key, line = o.group
        earlier = self.groups.first(hashlib.sha256(f"{stream}\0{key}".encode()).digest(), str(line))
        if earlier is not None:
            raise StageError(f"{o.name.rsplit('#', 1)[0]} line {line}: records of group {key} again, after other "
                             f"groups (it began at line {earlier}); group_by takes consecutive records with the "
                             "same key as one document: sort the file by the group_by fields")

    def close(self) -> dict[str, dict[str, Any]]:
        """Finish both Parquet files; their entries for the manifest's splits."""
        splits = {}
        for s, w in self.writers.items():
            w.close()
            if w.rows == 0:  # as before streaming: an empty table's columns are typed null, n_bytes int64
                parquet.write(pa.table({f.name: pa.array([], f.type if f.name == "n_bytes" else pa.null())
                                        for f in SCHEMA}), w.path, PARQUET)
            splits[s] = {"file": w.path.name, "digest": hashing.file_digest(w.path),
                         "docs": self.kept[s][0], "bytes": self.kept[s][1]}
        self.store.close()
        return splits


def curate(sources: list[tuple[Source, Path]], p: CurateParams, engine: Engine, out: Path,
           work: Path) -> Curation:
    """Curate every source into ``out``/{train,validation}.parquet; ``work`` holds scratch
    (dedup spill, the removed list, copied-out members). Call ``close()`` on the result."""
    c = Curation(p, out, work)
    done = bar(engine.map(process_shard, shards(sources, p, work)), "curate", unit=" shards")
    for o in stitched(done, p):
        c.add(o)
    return c
