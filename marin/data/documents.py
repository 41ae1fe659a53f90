"""The token shards read back as documents, and the windows a document's tokens are predicted
in: what the evaluate stage scores and what train's validation loss takes its first batch from.

Each document is cut on its own: the sequence ``[EOS] + tokens`` into windows of ``seq_len``
predictions, so every document token is predicted exactly once, from at most ``seq_len``
tokens of its own document.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq


def windows(ids: np.ndarray, eos_id: int, seq_len: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(inputs, targets, n_valid) windows covering every token of one document once."""
    seq = np.concatenate([[eos_id], ids]).astype(np.int32)
    for j in range(0, len(seq) - 1, seq_len):
        x, y = seq[j : j + seq_len], seq[j + 1 : j + seq_len + 1]
        n = len(y)
        pad = seq_len - n
        yield np.pad(x[:n], (0, pad), constant_values=eos_id), np.pad(y, (0, pad), constant_values=eos_id), n


def _batches(shards: Iterable[Path], columns: list[str], batch_rows: int) -> Iterator[Any]:
    for shard in shards:
        for b in pq.ParquetFile(shard).iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            if b.num_rows:
                yield b


def documents(shards: Iterable[Path], batch_rows: int = 256) -> Iterator[tuple[np.ndarray, str, int]]:
    """(token ids int32, corpus, UTF-8 bytes) of every document of the shards, in order,
    decoded ``batch_rows`` at a time."""
    for b in _batches(shards, ["tokens", "corpus", "n_bytes"], batch_rows):
        tokens = b.column("tokens")
        values = tokens.flatten().to_numpy(zero_copy_only=False)
        ends = np.cumsum(tokens.value_lengths().to_numpy(zero_copy_only=False))
        for ids, corpus, n in zip(np.split(values, ends[:-1]), b.column("corpus").to_pylist(),
                                  b.column("n_bytes").to_pylist(), strict=True):
            yield ids.astype(np.int32), corpus, n


def shard_tokens(shards: Iterable[Path], batch_rows: int = 1024) -> Iterator[np.ndarray]:
    """The token ids of the shards, ``batch_rows`` documents at a time, flat."""
    for b in _batches(shards, ["tokens"], batch_rows):
        yield b.column("tokens").flatten().to_numpy(zero_copy_only=False)
