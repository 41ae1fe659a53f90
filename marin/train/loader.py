"""The data loader: a pure function of (key, step) over the packed token stream.

Documents are concatenated in shard order with an EOS token between them (separator
tokens, not attention masking: attention may look across a boundary, the EOS tells the
model where a document starts). The stream is cut into fixed windows of ``seq_len + 1``
tokens that overlap by one (inputs and shifted targets). Sample ``g = step * B + b``
belongs to epoch ``g // S`` and position ``g % S``; a keyed permutation of ``[0, S)``
per epoch (a Feistel network with cycle walking, Black & Rogaway 2002) maps the position
to a window. Any step's batch is computed directly, without reading earlier ones, and the
permutation is pure Python arithmetic over sha256, so it never depends on a numpy or jax
version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROUNDS = 6


def _round(key: bytes, r: int, x: int, bits: int) -> int:
    h = hashlib.blake2b(x.to_bytes(8, "little"), key=key, digest_size=8, person=r.to_bytes(16, "little"))
    return int.from_bytes(h.digest(), "little") & ((1 << bits) - 1)


def permute(i: int, n: int, key: bytes) -> int:
    """The image of ``i`` under a keyed bijection of ``[0, n)``."""
    if not 0 <= i < n:
        raise IndexError(f"{i} not in [0, {n})")
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = i
    while True:  # cycle walking: at most a few iterations since 4**half < 4n
        left, right = x >> half, x & mask
        for r in range(ROUNDS):
            left, right = right, left ^ _round(key, r, right, half)
        x = (left << half) | right
        if x < n:
            return x


def epoch_key(data_key: bytes, epoch: int) -> bytes:
    return hashlib.sha256(data_key + b"epoch" + epoch.to_bytes(8, "little")).digest()[:32]


def read_stream(shards: list[Path], eos_id: int) -> np.ndarray:
    """All documents of the shards, in order, each followed by EOS (int32)."""
    parts = []
    for shard in shards:
        for ids in pq.read_table(shard, columns=["tokens"])["tokens"].to_numpy(zero_copy_only=False):
            parts.append(np.asarray(ids, dtype=np.int32))
            parts.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


@dataclass(frozen=True)
class Loader:
    stream: np.ndarray  # (N,) int32
    seq_len: int
    batch_size: int
    key: bytes  # the data-order key, derived from the root seed by name

    @property
    def windows(self) -> int:
        return (len(self.stream) - 1) // self.seq_len

    def position(self, step: int) -> dict[str, int]:
        """Where step ``step`` starts: epoch and position within the epoch."""
        g = step * self.batch_size
        return {"epoch": g // self.windows, "index": g % self.windows}

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """inputs and targets, each (B, T) int32, for optimizer step ``step``."""
        s, t = self.windows, self.seq_len
        if s < 1:
            raise ValueError(f"the token stream ({len(self.stream)} tokens) is shorter than one sequence")
        rows = []
        for b in range(self.batch_size):
            g = step * self.batch_size + b
            w = permute(g % s, s, epoch_key(self.key, g // s))
            rows.append(self.stream[w * t : w * t + t + 1])
        x = np.stack(rows)  # (B, T + 1)
        return {"inputs": x[:, :-1], "targets": x[:, 1:]}
