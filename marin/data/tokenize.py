"""Byte-level BPE (Sennrich et al. 2016; GPT-2's byte-level variant) with HF ``tokenizers``,
and token shards: one Parquet row per document, so document boundaries are explicit.

Nothing holds a split in memory. The tokenizer trains on a bounded sample of the train
split (:class:`Sample`) read batch by batch, or is a pinned pretrained file
(:func:`pretrained`); documents are encoded in batches of about ``ENCODE_BATCH_BYTES`` through
the data engine (:func:`encode_task`, results in order) and cut into shards as the results
arrive (:class:`ShardWriter`). Memory is a few batches and one shard, whatever the corpus.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from marin import hashing
from marin.config import PretrainedTokenizer, TokenizeParams
from marin.data import chat, parquet
from marin.data.engine import Engine
from marin.errors import ParamsError, StageError
from marin.paths import within

EOS = chat.EOS
SPECIAL_TOKENS = [EOS, *chat.CHAT_TOKENS]  # the chat tokens are reserved whether or not a fine-tune uses them
READ_ROWS = 64  # rows per read batch (Arrow decodes a whole row group anyway: curate bounds those)
ENCODE_BATCH_BYTES = 1 << 20  # text per engine task: a task costs ~100 bytes per token while it runs
PRETRAINED_DIR = "tokenizer"  # dvc.yaml's tokenize stage depends on it: DVC sees a file there change
# GPT-2's tokenizer.json is 1.4 MB (50,257 tokens), and at most MAX_IDS tokens fit uint16 ids: a file
# over 32 MiB, or with more JSON entries (commas) than a full vocabulary and its merges take, is
# refused before it is parsed (parsing costs ~16x the file in memory: 188 MB took 2.97 GB)
MAX_PRETRAINED_BYTES = 32 << 20
MAX_PRETRAINED_ENTRIES = 8 * (1 << 16)
MAX_IDS = 1 << 16  # shards hold uint16 ids
SAMPLE_KEY = b"marin-tokenize-sample-v1\0"
META = ("doc_id", "corpus", "n_bytes")


def _batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    # use_threads=False: with threads Arrow reads row groups ahead, and its memory grew by one
    # row group (100 MB here) per ~3 read (measured); one thread keeps it at one row group
    with pq.ParquetFile(path, pre_buffer=False) as f:
        yield from f.iter_batches(batch_size=READ_ROWS, columns=columns, use_threads=False)


def split_bytes(path: Path) -> int:
    """The sum of ``n_bytes`` over a curated split, read one column batch at a time."""
    return sum(pc.sum(b["n_bytes"]).as_py() or 0 for b in _batches(path, ["n_bytes"]))  # pyright: ignore[reportAttributeAccessIssue]


def sampled(doc_id: str, budget: int, total: int) -> bool:
    """A keyed-hash draw with probability ``budget / total``, in exact integer arithmetic."""
    h = int.from_bytes(hashlib.sha256(SAMPLE_KEY + doc_id.encode()).digest()[:8], "big")
    return h * total < budget << 64


@dataclass
class Sample:
    """The tokenizer's training sample of a split, a pure function of its bytes and ``budget``:
    every document when the split has at most ``budget`` bytes (in file order); else the
    documents a keyed hash of their ``doc_id`` draws with probability budget/bytes, in file
    order, skipping any that would take the sample past ``budget``. Iterating streams it."""

    path: Path
    budget: int
    docs: int = 0
    bytes: int = 0

    def __iter__(self) -> Iterator[str]:
        total = split_bytes(self.path)
        self.docs = self.bytes = 0
        for batch in _batches(self.path, ["doc_id", "n_bytes", "text"]):
            keep = []
            for i, (doc_id, n) in enumerate(zip(batch["doc_id"].to_pylist(), batch["n_bytes"].to_pylist(),
                                                strict=True)):
                if self.bytes + n <= self.budget and (total <= self.budget or sampled(doc_id, self.budget, total)):
                    keep.append(i)
                    self.docs, self.bytes = self.docs + 1, self.bytes + n
            if keep:
                yield from batch["text"].take(pa.array(keep, pa.int64())).to_pylist()


def train_tokenizer(texts: Iterable[str], p: TokenizeParams) -> Tokenizer:
    """Train on ``texts`` in the given order; the result is deterministic for a fixed order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=p.vocab_size, min_frequency=p.min_frequency, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load(path: Path) -> Tokenizer:
    return plain(Tokenizer.from_file(str(path)))


def plain(tok: Tokenizer) -> Tokenizer:
    """``tok`` with truncation and padding off: a file saved with either on would cut or pad
    every document (a pretrained ``tokenizer.json`` may carry them); and text is text: the
    string of a special token in it encodes as ordinary tokens, never the special id."""
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True  # a runtime switch: tokenizer.json's bytes do not change
    return tok


def specials(tok: Tokenizer) -> list[str]:
    """The strings of ``tok``'s special tokens, in id order."""
    return [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special]


# -- a pretrained tokenizer, pinned by digest ---------------------------------------------

@dataclass(frozen=True)
class Pinned:
    """A pretrained tokenizer file that matched its pin: project-relative path, bytes, tokenizer."""

    path: str
    data: bytes
    tokenizer: Tokenizer
    eos: str

    @property
    def digest(self) -> str:
        return hashing.bytes_digest(self.data)


def inside(root: Path, given: str) -> str:
    """``given`` as a project-relative POSIX path; outside the project is a params error (exit 2)."""
    rel = within(root, given)
    if rel is None:
        raise ParamsError(f"params.yaml: tokenize.pretrained.path: {given} lies outside the project; the "
                          "tokenize stage reads only project files: copy the tokenizer into the project")
    return rel


def tracked(rel: str) -> str:
    """``rel`` (project-relative) if it lies in :data:`PRETRAINED_DIR`, the folder dvc.yaml
    lists as the tokenize stage's dependency; elsewhere DVC would not see the file change."""
    if not rel.startswith(f"{PRETRAINED_DIR}/"):
        raise ParamsError(f"params.yaml: tokenize.pretrained.path: {rel} is not in {PRETRAINED_DIR}/, the folder "
                          f"dvc.yaml tracks for the tokenize stage; move the file into {PRETRAINED_DIR}/ and set "
                          "the path")
    return rel


def pretrained(root: Path, p: PretrainedTokenizer) -> Pinned:
    """The pinned tokenizer file, read once and checked against ``tokenize.pretrained.sha256``."""
    rel = inside(root, p.path)
    path = root / rel
    if not path.is_file():
        raise StageError(f"tokenize.pretrained.path: {rel} is not a file; put the tokenizer there or fix the path")
    if path.stat().st_size > MAX_PRETRAINED_BYTES:
        raise StageError(f"tokenize.pretrained.path: {rel} is over {MAX_PRETRAINED_BYTES >> 20} MiB; "
                         "a tokenizer.json of at most 65536 tokens is a few MB: check the file (refused unread)")
    data = path.read_bytes()
    digest = hashing.bytes_digest(data)
    if digest != f"sha256:{p.sha256}":
        raise StageError(f"tokenize.pretrained.sha256: {rel} hashes to {digest}, the params pin "
                         f"sha256:{p.sha256}; restore the pinned file, or pin the new one if it is intended")
    entries = data.count(b",") + 1  # every JSON entry but the last of a list or object ends with a comma
    if entries > MAX_PRETRAINED_ENTRIES:
        raise StageError(f"tokenize.pretrained.path: {rel} has about {entries:,} JSON entries, more than a vocabulary "
                         f"of {MAX_IDS} tokens and its merges take ({MAX_PRETRAINED_ENTRIES:,}); token shards hold "
                         "uint16 ids: use a smaller vocabulary (refused before parsing)")
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception on a bad file
        raise StageError(f"tokenize.pretrained.path: {rel} is not a tokenizers JSON file "
                         f"({str(e).splitlines()[0][:120]}); save it with Tokenizer.save") from None
    if tok.get_vocab_size() > MAX_IDS:
        raise StageError(f"tokenize.pretrained.path: {rel} has {tok.get_vocab_size()} tokens; token shards "
                         f"hold uint16 ids, so at most {MAX_IDS}: use a smaller vocabulary")
    if tok.token_to_id(p.eos) is None:
        raise StageError(f"tokenize.pretrained.eos: {p.eos!r} is not a token of {rel}; set "
                         "tokenize.pretrained.eos to its end-of-text token")
    with panics_refused(f"tokenize.pretrained.path: {rel}"):  # before any run starts
        tok.encode_batch_fast(list(PROBES), add_special_tokens=False)
        forged = chat.forgeable(plain(tok), [p.eos, *chat.CHAT_TOKENS])  # no padding: it would add ids
    if forged is not None:
        raise StageError(f"tokenize.pretrained.path: {rel}: {forged[0]!r} {forged[1]}, so text holding that string "
                         "would become it (a forged turn or document end); mark it special in the file's "
                         "added_tokens (refused)")
    return Pinned(rel, data, tok, p.eos)


# runs of one character and a mismatch: what makes a backtracking regex (``(a|aa)+$``) exceed
# Oniguruma's retry limit, which tokenizers turns into a Rust panic
PROBES = tuple(c * 4096 + end for c in ("a", " ", "1", "é", ".", "\n") for end in ("!", "a", " "))


@contextmanager
def panics_refused(what: str) -> Iterator[None]:
    """A Rust panic inside tokenizers (a pre-tokenizer regex that backtracks past Oniguruma's retry
    limit) as one StageError; the panic's own report on stderr (fd 2) goes to /dev/null meanwhile."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    except BaseException as e:  # pyo3's PanicException derives from BaseException
        if type(e).__name__ != "PanicException":
            raise
        raise StageError(f"{what}: the tokenizer panicked ({str(e).splitlines()[0][:120]}): its pre-tokenizer "
                         "regex backtracks without bound; use a tokenizer whose regex does not (refused)") from None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def with_chat_tokens(tok: Tokenizer) -> list[str]:
    """Add the chat tokens ``tok`` lacks as special tokens (after its vocabulary); the ones added."""
    missing = [t for t in chat.CHAT_TOKENS if tok.token_to_id(t) is None]
    if missing:
        tok.add_special_tokens(missing)
        if tok.get_vocab_size() > MAX_IDS:
            raise StageError(f"the tokenizer has {tok.get_vocab_size()} tokens with the chat tokens added; token "
                             f"shards hold uint16 ids, so at most {MAX_IDS}: use a smaller vocabulary")
    return missing


def describe(tok: Tokenizer, eos: str) -> dict[str, Any]:
    """The manifest's ``tokenizer`` facts (without file and digest) for a trained or pretrained one."""
    spec = json.loads(tok.to_str())
    model = (spec.get("model") or {}).get("type", "unknown")
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    return {"type": "byte-level BPE" if model == "BPE" and byte_level else model,
            "vocab_size": tok.get_vocab_size(), "special_tokens": specials(tok),
            "eos_id": tok.token_to_id(eos), "library": "tokenizers"}


# -- encoding: engine tasks, in order --------------------------------------------------------

@dataclass(frozen=True)
class EncodeTask:
    """One engine task: a batch of documents and the tokenizer (its JSON; loaded once per worker)."""

    tokenizer: str
    texts: list[str]


@functools.lru_cache(maxsize=2)
def _tokenizer(spec: str) -> tuple[Tokenizer, list[str]]:
    tok = plain(Tokenizer.from_str(spec))
    return tok, specials(tok)


@contextmanager
def _one_thread() -> Iterator[None]:
    """tokenizers' own thread pool off: parallelism comes from the engine's workers, and the
    pool's idle threads spin (measured: ~15% more CPU for the same ids on 2 cores)."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def encode_task(task: EncodeTask) -> tuple[np.ndarray, np.ndarray, int]:
    """(token count per document int64, all ids uint16, documents holding a special token's
    string): ids without special tokens (the loader adds EOS; such a string in a document encodes
    as text). ``encode_batch_fast`` skips offsets: the same ids as ``encode_batch``, less CPU."""
    tok, strings = _tokenizer(task.tokenizer)
    with _one_thread(), panics_refused("tokenize: encoding a batch of documents"):
        encodings = tok.encode_batch_fast(task.texts, add_special_tokens=False)
    ids = [np.array(e.ids, dtype=np.uint16) for e in encodings]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    carrying = sum(chat.carries(t, strings) for t in task.texts)
    return lengths, np.concatenate(ids) if ids else np.zeros(0, np.uint16), carrying


def _read(path: Path) -> Iterator[tuple[pa.Table, list[str]]]:
    """(doc_id, corpus, n_bytes) and texts of about ENCODE_BATCH_BYTES of documents at a time."""
    parts: list[pa.RecordBatch] = []
    size = 0
    for batch in _batches(path, [*META, "text"]):
        parts.append(batch)
        size += pc.sum(batch["n_bytes"]).as_py() or 0  # pyright: ignore[reportAttributeAccessIssue]
        if size >= ENCODE_BATCH_BYTES:
            yield _take(parts)
            parts, size = [], 0
    if parts:
        yield _take(parts)


def _take(parts: list[pa.RecordBatch]) -> tuple[pa.Table, list[str]]:
    table = pa.Table.from_batches(parts)
    return table.select(list(META)), table["text"].to_pylist()


def encoded(path: Path, spec: str, engine: Engine) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray, int]]:
    """(metadata, token counts, ids, documents holding a special token's string) per batch of a
    split, in file order, encoded by ``engine``."""
    metas: deque[pa.Table] = deque()  # a task's metadata waits here for its result (results come in order)

    def tasks() -> Iterator[EncodeTask]:
        for meta, texts in _read(path):
            metas.append(meta)
            yield EncodeTask(spec, texts)

    for lengths, ids, carrying in engine.map(encode_task, tasks()):
        yield metas.popleft(), lengths, ids, carrying


# -- shards --------------------------------------------------------------------------------

def shard_name(split: str, i: int, n: int) -> str:
    return f"{split}-{i:05d}-of-{n:05d}.parquet"


class ShardWriter:
    """Cuts the document stream into ``<split>-<i>-of-<n>.parquet`` shards (doc_id, corpus,
    n_bytes, tokens) of at most ``max_tokens`` tokens (at least one document), writing each
    as soon as it is full; :meth:`close` names them once ``n`` is known."""

    def __init__(self, out: Path, split: str, max_tokens: int):
        self.out, self.split, self.max_tokens = out, split, max_tokens
        self.parts: list[tuple[pa.Table, np.ndarray, np.ndarray]] = []
        self.docs = self.tokens = 0
        self.shards: list[dict[str, Any]] = []

    def add(self, meta: pa.Table, lengths: np.ndarray, ids: np.ndarray) -> None:
        start, at = 0, 0  # first row and first id of this batch not yet in a part
        for i, n in enumerate(lengths.tolist()):
            if self.docs and self.tokens + n > self.max_tokens:
                end = at + int(lengths[start:i].sum())
                self._part(meta, lengths, ids, start, i, at, end)
                self._flush()
                start, at = i, end
            self.docs, self.tokens = self.docs + 1, self.tokens + n
        self._part(meta, lengths, ids, start, len(lengths), at, len(ids))

    def _part(self, meta: pa.Table, lengths: np.ndarray, ids: np.ndarray, a: int, b: int, i: int, j: int) -> None:
        if b > a:
            self.parts.append((meta.slice(a, b - a), lengths[a:b], ids[i:j]))

    def _flush(self) -> None:
        meta = pa.concat_tables([m for m, _, _ in self.parts])
        lengths = np.concatenate([x for _, x, _ in self.parts])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        # one chunk per column: Parquet pages can split differently at chunk boundaries
        shard = pa.table({**{k: meta[k].combine_chunks() for k in META},
                          "tokens": pa.ListArray.from_arrays(pa.array(offsets),
                                                             pa.array(np.concatenate([x for _, _, x in self.parts])))})
        path = self.out / f".{self.split}-{len(self.shards):05d}.partial"
        parquet.write(shard, path)
        self.shards.append({"file": path.name, "digest": hashing.file_digest(path), "docs": shard.num_rows,
                            "tokens": int(offsets[-1])})
        self.parts, self.docs, self.tokens = [], 0, 0

    def close(self) -> list[dict[str, Any]]:
        """Write the last shard and give each its final name; the manifest's ``shards`` list."""
        if self.parts:
            self._flush()
        for i, s in enumerate(self.shards):
            name = shard_name(self.split, i, len(self.shards))
            os.replace(self.out / s["file"], self.out / name)
            s["file"] = name
        return self.shards
