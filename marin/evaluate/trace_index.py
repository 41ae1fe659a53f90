"""The trace index: the training documents' token ids with one suffix array over them
(:mod:`marin.evaluate.sarray`), a document table and unigram counts; and the search for the maximal
spans of a text that occur verbatim in it (OLMoTrace, Liu et al. 2025, over an infini-gram-like index).

Folder layout (every file a pure function of the documents in order and ``shard_tokens``; all but
``index.json`` of the documents alone):

- ``tokens.u32``: the documents' tokens, each document ended by ``SEP``.
- ``sa.i32`` (``sa.i64`` past 2**31 tokens): the suffix array of ``tokens.u32``, and ``first.i64``, where
  the suffixes of each first token start in it. It is built in shards of whole documents, at most
  ``shard_tokens`` tokens (or one document), each sorted alone, then merged a block at a time
  (:mod:`marin.evaluate.sa_merge`): building holds one shard or one block, so memory does not grow with
  the corpus, and a search is one binary search over the whole index, so its time does not either.
- ``docs.jsonl``: one line per document, in order: id, corpus, source, licence, start (in ``tokens.u32``),
  tokens.
- ``unigram.u64``: each token id's count over the index (the span's unigram probability, to rank rare
  spans above common ones, as OLMoTrace does).
- ``index.json``: counts, the shard size and each shard's length; written last, it marks the index
  complete.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin import readers
from marin.errors import MarinError
from marin.evaluate import sa_merge, sa_search, sarray

FORMAT = "marin-trace-index/2"
INDEX_JSON, DOCS, UNIGRAM = "index.json", "docs.jsonl", "unigram.u64"
MAX_DOCS = 10  # documents listed per span (the count covers them all)
CONTEXT = 12  # tokens of the document shown on each side of a span
WORK = "merge.work"  # the shards' suffix arrays and keys while building, removed once merged


class TraceError(MarinError):
    """The index is missing, incomplete or unusable for this question."""


@dataclass(frozen=True)
class Doc:
    """A training document: its ids and what the trace shows of it."""

    id: str
    corpus: str
    source: str
    license: str
    ids: np.ndarray


class _Builder:
    def __init__(self, folder: Path, shard_tokens: int):
        self.folder, self.shard_tokens, self.work = folder, shard_tokens, folder / WORK
        self.work.mkdir()
        self.parts: list[np.ndarray] = []
        self.held = self.shards = self.docs = self.tokens = self.start = 0
        self.sizes: list[int] = []
        self.counts = np.zeros(sarray.FIRST_IDS, dtype=np.int64)
        (folder / sarray.TOKENS_FILE).touch()
        self.table = open(folder / DOCS, "w", encoding="utf-8")  # noqa: SIM115 (closed by finish())

    def add(self, doc: Doc) -> None:
        bad = doc.ids[(doc.ids < 0) | (doc.ids >= sarray.TOKEN_LIMIT)]
        if len(bad):
            raise TraceError(f"document {doc.id!r} holds token id {int(bad[0])}: the trace index takes ids 0 to "
                             f"{sarray.TOKEN_LIMIT - 1}; use a vocabulary below {sarray.TOKEN_LIMIT}")
        if self.parts and self.held + len(doc.ids) + 1 > self.shard_tokens:
            self._flush()
        row = {"id": doc.id, "corpus": doc.corpus, "source": doc.source, "license": doc.license,
               "start": self.start, "tokens": len(doc.ids)}
        self.table.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
        self.parts.append(np.append(doc.ids.astype(np.int64), sarray.SEP))
        self.held, self.start = self.held + len(doc.ids) + 1, self.start + len(doc.ids) + 1
        self.docs, self.tokens = self.docs + 1, self.tokens + len(doc.ids)

    def _flush(self) -> None:
        tokens = np.concatenate(self.parts)
        self.counts += np.bincount(tokens[tokens != sarray.SEP], minlength=len(self.counts))
        self.sizes.append(sarray.append_shard(self.folder, self.work, tokens))
        self.parts, self.held, self.shards = [], 0, self.shards + 1

    def finish(self) -> dict[str, Any]:
        if self.parts:
            self._flush()
        self.table.close()
        n = sum(self.sizes)
        for name in ("sa.i32", "keys.u64"):
            (self.work / name).touch()
        # a merge block of a quarter shard: its arrays stay below the shard sort's
        sa_merge.merge(self.folder / sarray.TOKENS_FILE, self.work, self.sizes, self.folder / sarray.sa_file(n),
                       max(1, self.shard_tokens // 4))
        shutil.rmtree(self.work)
        for name, data in ((sarray.FIRST_FILE, sarray.first_table(self.counts)), (UNIGRAM, self.counts.astype("<u8"))):
            with open(self.folder / name, "wb") as f:
                sarray.write_array(f, data)
        meta = {"format": FORMAT, "documents": self.docs, "tokens": self.tokens, "shards": self.shards,
                "shard_tokens": self.shard_tokens, "shard_sizes": self.sizes}
        (self.folder / INDEX_JSON).write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n")
        return meta


def build(docs: Iterable[Doc], folder: Path, shard_tokens: int) -> dict[str, Any]:
    """Index ``docs`` in order into ``folder`` (created); the counts written to ``index.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    b = _Builder(folder, shard_tokens)
    try:
        for doc in docs:
            b.add(doc)
        return b.finish()
    except BaseException:
        with suppress(OSError):  # a full disk fails its flush too: closed here, not later by the collector
            b.table.close()
        raise


@dataclass(frozen=True)
class Span:
    """A maximal run of the text's tokens ``[start, start + length)`` found verbatim in the index."""

    start: int
    length: int
    count: int
    log10_unigram: float
    hits: list[int]  # where at most MAX_DOCS occurrences start in tokens.u32: the first in suffix order, sorted


class Index:
    """A built index, opened for search (its token file and suffix array memory-mapped)."""

    def __init__(self, folder: Path):
        meta_path = folder / INDEX_JSON
        if not meta_path.is_file():
            raise TraceError(f"{folder} holds no complete trace index ({INDEX_JSON} is missing); "
                             "run `dvc repro trace_index`")
        self.folder, self.meta = folder, readers.read_json(meta_path, "json", TraceError)
        if self.meta.get("format") != FORMAT:
            raise TraceError(f"{meta_path} is format {self.meta.get('format')!r}, not {FORMAT!r}; rebuild it: "
                             "`dvc repro trace_index`")
        self.store = sarray.Store(folder, sum(self.meta["shard_sizes"]))
        self.rows = [json.loads(line) for line in readers.lines(folder / DOCS, "manifest", TraceError)]
        self.starts = np.array([r["start"] for r in self.rows], dtype=np.int64)
        self.counts = np.memmap(folder / UNIGRAM, dtype="<u8", mode="r")
        self.log10_total = math.log10(max(int(self.counts.sum()), 1))

    def longest(self, ids: np.ndarray) -> np.ndarray:
        """Per position of ``ids``: the longest run of them from there that occurs in the index."""
        return sa_search.longest(self.store, ids)

    def spans(self, ids: np.ndarray, min_tokens: int, longest: np.ndarray | None = None) -> list[Span]:
        """The maximal spans of ``ids`` of at least ``min_tokens`` tokens that occur in the index, in
        text order (``longest``: :meth:`longest` of ``ids``, when the caller has it)."""
        if longest is None:
            longest = self.longest(ids)
        reach, found = -1, []
        for i, n in enumerate(longest.tolist()):
            if i + n > reach and n >= min_tokens:  # not inside a span that starts earlier
                found.append((i, n))
            reach = max(reach, i + n)
        return self._counted(ids, found)

    def _counted(self, ids: np.ndarray, found: list[tuple[int, int]]) -> list[Span]:
        if not found:
            return []
        start, length = (np.array(x, dtype=np.int64) for x in zip(*found, strict=True))
        lo, hi = sa_search.occurrences(self.store, np.asarray(ids, dtype=np.int64), start, length)
        hits = [np.sort(self.store.sa[a:min(b, a + MAX_DOCS)]).tolist() for a, b in zip(lo.tolist(), hi.tolist(),
                                                                                         strict=True)]
        return [Span(i, n, int(c), self.log10_unigram(ids[i:i + n]), h)
                for (i, n), c, h in zip(found, (hi - lo).tolist(), hits, strict=True)]

    def log10_unigram(self, ids: np.ndarray) -> float:
        """log10 of the span's unigram probability (each token's count over the index's tokens), rounded
        to 4 places: libm's scalar log10, summed in order, never a SIMD kernel chosen by the CPU."""
        return round(sum(math.log10(int(self.counts[t])) for t in ids.tolist()) - len(ids) * self.log10_total, 4)

    def locate(self, position: int) -> tuple[dict[str, Any], int]:
        """The document row holding ``position`` of ``tokens.u32``, and the position within the document."""
        row = self.rows[int(np.searchsorted(self.starts, position, side="right")) - 1]
        return row, position - row["start"]

    def context(self, start: int, length: int, row: dict[str, Any]) -> tuple[np.ndarray, ...]:
        """The document's tokens before, in and after a span (at most CONTEXT on each side)."""
        t = self.store.tokens
        doc_lo, doc_hi = row["start"], row["start"] + row["tokens"]
        lo, hi = max(doc_lo, start - CONTEXT), min(doc_hi, start + length + CONTEXT)
        return (np.asarray(t[lo:start]), np.asarray(t[start:start + length]), np.asarray(t[start + length:hi]))


def unigram_rank(spans: list[Span]) -> list[Span]:
    """Rarest first: ascending unigram probability (OLMoTrace's ranking), then text order."""
    return sorted(spans, key=lambda s: (s.log10_unigram, s.start))


def tokens_covered(spans: list[Span], total: int) -> int:
    """How many of the text's ``total`` tokens lie inside at least one span."""
    inside = np.zeros(total, dtype=bool)
    for s in spans:
        inside[s.start:s.start + s.length] = True
    return int(inside.sum())
