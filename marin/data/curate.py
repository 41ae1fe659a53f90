"""Curation: documents from raw archives → normalized, filtered, deduplicated, split.

Documents are natural units: a play, a poem, a Milton work, a Bible chapter. The
funnel (documents and bytes in, removed per step with the reason, kept) is counted per
corpus and per step for the manifest.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import hashing
from marin.config import CurateParams, Extract, Source
from marin.data import archive, filters
from marin.data.dedup import NearDuplicateIndex
from marin.errors import StageError


@dataclass(frozen=True)
class Doc:
    corpus: str
    source: str
    license: str
    name: str  # member path, or member path + group key for grouped records
    text: str

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))

    @property
    def doc_id(self) -> str:
        return hashing.bytes_digest(self.text.encode("utf-8"))


@dataclass(frozen=True)
class Removal:
    corpus: str
    name: str
    step: str
    detail: str
    n_bytes: int
    doc_id: str | None = None


def _decode(data: bytes) -> str:
    text = data.decode("utf-8-sig")  # strict: a bad byte is a removal, not a silent fix
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _jsonl_docs(name: str, text: str, ex: Extract) -> Iterator[tuple[str, str]]:
    groups: dict[tuple[Any, ...], list[str]] = {}
    for i, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = tuple(rec[k] for k in ex.group_by) if ex.group_by else (i,)
            groups.setdefault(key, []).append(str(rec[ex.text_field]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise StageError(f"{name} line {i}: not a JSON record with field(s) {ex.text_field!r}, "
                             f"{list(ex.group_by)}: {e}") from None
    for key, parts in groups.items():  # first-appearance order, as in the file
        yield f"{name}#{' '.join(str(k) for k in key)}", "\n".join(parts)


def read_documents(source: Source, archive_path: Path) -> Iterator[Doc | Removal]:
    """Documents of one source in a fixed order; undecodable members become removals."""
    for ex in source.extract:
        found = False
        for name, data in archive.members(archive_path, ex.include, ex.exclude):
            found = True
            try:
                text = _decode(data)
            except UnicodeDecodeError as e:
                yield Removal(ex.corpus, name, "utf8", f"not UTF-8 at byte {e.start}", len(data))
                continue
            if ex.format == "text":
                yield Doc(ex.corpus, source.name, source.license, name, text)
            else:
                for dname, dtext in _jsonl_docs(name, text, ex):
                    yield Doc(ex.corpus, source.name, source.license, dname, dtext)
        if not found:
            raise StageError(
                f"fetch.sources[{source.name}].extract[{ex.corpus}]: no member of "
                f"{archive_path.name} matches {list(ex.include)}; check the include patterns"
            )


def normalize(text: str, form: str) -> str:
    text = text.strip()
    return text if form == "none" else unicodedata.normalize(form, text)


def split_of(doc_id: str, salt: str, validation_fraction: float) -> str:
    """Deterministic split: a keyed hash of the document digest, compared to the fraction."""
    h = hashlib.sha256(f"{salt}\0{doc_id}".encode()).digest()
    return "validation" if int.from_bytes(h[:8], "big") / 2**64 < validation_fraction else "train"


STEPS = ("utf8", "empty", *(n for n, _ in filters.RULES), "exact_dedup", "near_dedup")


@dataclass
class Curated:
    kept: list[tuple[Doc, str]] = field(default_factory=list)  # (doc, split)
    removed: list[Removal] = field(default_factory=list)
    docs_in: list[tuple[str, int]] = field(default_factory=list)  # (corpus, bytes)
    corpus_meta: dict[str, dict[str, str]] = field(default_factory=dict)

    def funnel(self) -> dict[str, Any]:
        """Per corpus and per step: documents and bytes in, removed (by reason), kept."""
        def zero() -> dict[str, int]:
            return {"docs": 0, "bytes": 0}

        per: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"in": zero(), "removed": {s: zero() for s in STEPS}, "kept": zero(),
                     "train": zero(), "validation": zero()}
        )
        for corpus, n in self.docs_in:
            per[corpus]["in"]["docs"] += 1
            per[corpus]["in"]["bytes"] += n
        for r in self.removed:
            per[r.corpus]["removed"][r.step]["docs"] += 1
            per[r.corpus]["removed"][r.step]["bytes"] += r.n_bytes
        for d, split in self.kept:
            for k in ("kept", split):
                per[d.corpus][k]["docs"] += 1
                per[d.corpus][k]["bytes"] += d.n_bytes
        steps = []
        live = {"docs": len(self.docs_in), "bytes": sum(n for _, n in self.docs_in)}
        for s in STEPS:
            rem = {"docs": sum(p["removed"][s]["docs"] for p in per.values()),
                   "bytes": sum(p["removed"][s]["bytes"] for p in per.values())}
            out = {"docs": live["docs"] - rem["docs"], "bytes": live["bytes"] - rem["bytes"]}
            steps.append({"step": s, "in": live, "removed": rem, "out": out})
            live = out
        corpora = {c: {**self.corpus_meta.get(c, {}), **v} for c, v in sorted(per.items())}
        return {"corpora": corpora, "steps": steps}


def curate(sources: list[tuple[Source, Path]], p: CurateParams) -> Curated:
    """Run every step over the documents of every source, in params order."""
    out = Curated()
    seen: dict[str, str] = {}  # exact text digest -> name of the first document
    near = NearDuplicateIndex(p.dedup.near) if p.dedup.near.enabled else None
    for source, path in sources:
        for item in read_documents(source, path):
            if isinstance(item, Removal):
                out.docs_in.append((item.corpus, item.n_bytes))
                out.removed.append(item)
                continue
            out.corpus_meta.setdefault(item.corpus, {"source": source.name, "license": source.license})
            raw_bytes = item.n_bytes
            out.docs_in.append((item.corpus, raw_bytes))
            doc = Doc(item.corpus, item.source, item.license, item.name,
                      normalize(item.text, p.normalization))
            step = _remove_reason(doc, p, seen, near)
            if step is not None:
                out.removed.append(Removal(doc.corpus, doc.name, step[0], step[1], raw_bytes, doc.doc_id))
                continue
            out.kept.append((doc, split_of(doc.doc_id, p.split.salt, p.split.validation_fraction)))
    return out


def _remove_reason(
    doc: Doc, p: CurateParams, seen: dict[str, str], near: NearDuplicateIndex | None
) -> tuple[str, str] | None:
    if not doc.text:
        return "empty", "no text after normalization"
    failed = filters.first_failure(filters.stats(doc.text), p.filters)
    if failed is not None:
        return failed
    if p.dedup.exact:
        first = seen.get(doc.doc_id)
        if first is not None:
            return "exact_dedup", f"identical to {first}"
        seen[doc.doc_id] = doc.name
    if near is not None:
        dup = near.add(doc.name, doc.text)
        if dup is not None:
            return "near_dedup", f"estimated Jaccard {dup[1]:.3f} with {dup[0]}"
    return None
