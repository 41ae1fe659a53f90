"""Byte-level BPE (Sennrich et al. 2016; GPT-2's byte-level variant) with HF ``tokenizers``,
and token shards: one Parquet row per document, so document boundaries are explicit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from marin import hashing
from marin.config import TokenizeParams
from marin.data import parquet
from marin.progress import bar

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS]


def train_tokenizer(texts: list[str], p: TokenizeParams) -> Tokenizer:
    """Train on ``texts`` in the given order; the result is deterministic for a fixed order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=p.vocab_size, min_frequency=p.min_frequency, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def load(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode(tok: Tokenizer, texts: list[str], desc: str = "tokenize", chunk: int = 256) -> list[np.ndarray]:
    """Token ids per document (uint16), without special tokens; the loader adds EOS.
    Encoded ``chunk`` documents at a time, with a progress bar on stderr."""
    out: list[np.ndarray] = []
    for i in bar(range(0, len(texts), chunk), desc, total=-(-len(texts) // chunk), unit="chunk"):
        out += [np.asarray(e.ids, dtype=np.uint16) for e in tok.encode_batch(texts[i : i + chunk])]
    return out


def shard_rows(token_counts: list[int], max_tokens: int) -> Iterator[tuple[int, int]]:
    """(start, stop) row ranges with at most ``max_tokens`` tokens each (at least one row)."""
    start, total = 0, 0
    for i, n in enumerate(token_counts):
        if i > start and total + n > max_tokens:
            yield start, i
            start, total = i, 0
        total += n
    if start < len(token_counts):
        yield start, len(token_counts)


def write_shards(
    out: Path, split: str, table: pa.Table, ids: list[np.ndarray], max_tokens: int
) -> list[dict[str, Any]]:
    """Write ``<split>-<i>-of-<n>.parquet`` shards: doc_id, corpus, n_bytes, tokens."""
    ranges = list(shard_rows([len(x) for x in ids], max_tokens))
    shards = []
    for i, (a, b) in enumerate(ranges):
        name = f"{split}-{i:05d}-of-{len(ranges):05d}.parquet"
        shard = pa.table({
            "doc_id": table["doc_id"].slice(a, b - a),
            "corpus": table["corpus"].slice(a, b - a),
            "n_bytes": table["n_bytes"].slice(a, b - a),
            "tokens": pa.array([x.tolist() for x in ids[a:b]], pa.list_(pa.uint16())),
        })
        parquet.write(shard, out / name)
        shards.append({"file": name, "digest": hashing.file_digest(out / name), "docs": b - a,
                       "tokens": int(sum(len(x) for x in ids[a:b]))})
    return shards
