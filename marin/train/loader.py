"""The data loader: a pure function of (key, step) over the packed token stream.

Documents are concatenated in shard order with an EOS token between them (separator
tokens, not attention masking: attention may look across a boundary, the EOS tells the
model where a document starts). The stream is cut into fixed windows of ``seq_len + 1``
tokens that overlap by one (inputs and shifted targets). Sample ``g = step * B + b``
belongs to epoch ``g // S`` and position ``g % S``; a keyed permutation of ``[0, S)``
per epoch (a Feistel network with cycle walking, Black & Rogaway 2002) maps the position
to a window. Any step's batch is computed directly, without reading earlier ones. The
permutation is integer arithmetic over blake2b (:func:`permute` is its definition;
:class:`Permutation` tabulates the round function and applies it to a whole batch), so it
never depends on a numpy or jax version.

The stream is never held in memory: on first use it is written once, flat, to
``.marin/cache/tokens/<key>/`` (git-ignored; the key covers the shards' sha256, the EOS id
and the format), and each window is read from there with ``pread``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from marin import fsutil, hashing
from marin.errors import StageError
from marin.ledger.bodies import LoaderPosition

ROUNDS = 6
CACHE = Path(".marin/cache/tokens")
CACHE_FORMAT = "marin-token-stream-v1"  # documents in shard order, each followed by EOS; native byte order
_READ_ROWS = 1024  # documents decoded at a time while the cache is built


def _round(key: bytes, r: int, x: int, bits: int) -> int:
    h = hashlib.blake2b(x.to_bytes(8, "little"), key=key, digest_size=8, person=r.to_bytes(16, "little"))
    return int.from_bytes(h.digest(), "little") & ((1 << bits) - 1)


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def permute(i: int, n: int, key: bytes) -> int:
    """The image of ``i`` under a keyed bijection of ``[0, n)``."""
    if not 0 <= i < n:
        raise IndexError(f"{i} not in [0, {n})")
    half = _half_bits(n)
    mask = (1 << half) - 1
    x = i
    while True:  # cycle walking: at most a few iterations since 4**half < 4n
        left, right = x >> half, x & mask
        for r in range(ROUNDS):
            left, right = right, left ^ _round(key, r, right, half)
        x = (left << half) | right
        if x < n:
            return x


class Permutation:
    """:func:`permute` for one (n, key), applied to arrays.

    The round function only ever sees ``right < 2**half``, so it is tabulated once
    (``ROUNDS * 2**half`` blake2b calls, about ``12 * sqrt(n)``); the Feistel rounds and the
    cycle walk are then integer lookups and XORs, bit for bit those of :func:`permute`.
    """

    def __init__(self, n: int, key: bytes):
        if n < 1:
            raise ValueError(f"a permutation of [0, {n}) is empty")
        self.n, self.half = n, _half_bits(n)
        self.table = np.array([[_round(key, r, x, self.half) for x in range(1 << self.half)]
                               for r in range(ROUNDS)], dtype=np.uint64)  # (ROUNDS, 2**half)

    def __call__(self, i: np.ndarray) -> np.ndarray:
        """The images of ``i`` (any integer array in ``[0, n)``), as int64."""
        x = np.asarray(i, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"indices not in [0, {self.n})")
        x = x.astype(np.uint64)
        todo = np.ones(x.shape, dtype=bool)  # every index takes at least one pass
        while todo.any():
            y = x[todo]
            left, right = y >> self.half, y & ((1 << self.half) - 1)
            for r in range(ROUNDS):
                left, right = right, left ^ self.table[r][right]
            x[todo] = (left << self.half) | right
            todo &= x >= self.n
        return x.astype(np.int64)


def epoch_key(data_key: bytes, epoch: int) -> bytes:
    return hashlib.sha256(data_key + b"epoch" + epoch.to_bytes(8, "little")).digest()[:32]


@functools.lru_cache(maxsize=4)  # every step of an epoch reuses its table
def _epoch_permutation(n: int, data_key: bytes, epoch: int) -> Permutation:
    return Permutation(n, epoch_key(data_key, epoch))


def sample_windows(step: int, batch_size: int, n_windows: int, data_key: bytes) -> np.ndarray:
    """Window index of each sample of step ``step``, (B,) int64: sample ``g = step*B + b`` is
    position ``g % S`` of epoch ``g // S``, permuted by that epoch's key."""
    g = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epoch, pos = g // n_windows, g % n_windows
    out = np.empty(batch_size, dtype=np.int64)
    for e in np.unique(epoch).tolist():
        sel = epoch == e
        out[sel] = _epoch_permutation(n_windows, data_key, int(e))(pos[sel])
    return out


def window_bounds(w: int, seq_len: int) -> tuple[int, int]:
    """[start, stop) of window ``w`` in the stream: ``seq_len + 1`` tokens, overlapping the next by one."""
    return w * seq_len, w * seq_len + seq_len + 1


# -- the packed stream, on disk -------------------------------------------------------------

def token_chunks(shard: Path, batch_rows: int = _READ_ROWS) -> Iterator[pa.ListArray]:
    """The ``tokens`` column of a shard, ``batch_rows`` documents at a time, in row order."""
    for batch in pq.ParquetFile(shard).iter_batches(batch_size=batch_rows, columns=["tokens"], use_threads=False):
        yield batch.column(0)


def _packed(tokens: pa.ListArray, eos_id: int, dtype: np.dtype) -> np.ndarray:
    """The documents of ``tokens``, each followed by EOS, flat."""
    if tokens.null_count:
        raise StageError("a token shard holds a null document; rerun tokenize")
    values = tokens.flatten().to_numpy(zero_copy_only=False)
    lengths = tokens.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    eos_at = np.cumsum(lengths) + np.arange(len(lengths))  # each document's end, shifted by the EOS before it
    out = np.empty(len(values) + len(lengths), dtype=dtype)
    is_eos = np.zeros(len(out), dtype=bool)
    is_eos[eos_at] = True
    out[eos_at] = eos_id
    out[~is_eos] = values
    return out


def _stream_dtype(shards: list[Path], eos_id: int) -> np.dtype:
    # uint16 ids (the tokenizer's format, vocab <= 65535) stay uint16: half the disk of int32.
    narrow = all(pq.read_schema(s).field("tokens").type.value_type == pa.uint16() for s in shards)
    return np.dtype(np.uint16) if narrow and 0 <= eos_id < 1 << 16 else np.dtype(np.int32)


@dataclass(frozen=True)
class TokenStream:
    """The packed stream in a flat file; windows are read with ``pread`` (nothing is mapped,
    so the process holds only what it reads)."""

    path: Path
    dtype: np.dtype
    length: int  # tokens
    fd: int

    @classmethod
    def open(cls, path: Path, dtype: np.dtype) -> TokenStream:
        fd = os.open(path, os.O_RDONLY)
        return cls(path, dtype, os.fstat(fd).st_size // dtype.itemsize, fd)

    def __len__(self) -> int:
        return self.length

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` as int32."""
        if not 0 <= start <= stop <= self.length:
            raise IndexError(f"[{start}, {stop}) not in a stream of {self.length} tokens")
        n, size = (stop - start) * self.dtype.itemsize, self.dtype.itemsize
        data = os.pread(self.fd, n, start * size)
        if len(data) != n:
            raise StageError(f"{self.path}: short read at token {start}; the token cache was changed: "
                             f"delete {self.path.parent} and rerun")
        return np.frombuffer(data, dtype=self.dtype).astype(np.int32)


def open_stream(shards: list[Path], eos_id: int, cache_dir: Path,
                file_digest: Callable[[Path], str] = hashing.file_digest) -> TokenStream:
    """The packed stream of ``shards``, from the cache, built there first if needed."""
    dtype = _stream_dtype(shards, eos_id)
    digests = [file_digest(s) for s in shards]
    key = hashing.json_digest({"format": CACHE_FORMAT, "dtype": dtype.str, "eos_id": eos_id, "shards": digests})
    entry = cache_dir / key.removeprefix(hashing.PREFIX)
    path = entry / f"tokens.{dtype.name}"
    if not path.is_file():
        _build(shards, digests, eos_id, dtype, entry, path.name)
    return TokenStream.open(path, dtype)


def _build(shards: list[Path], digests: list[str], eos_id: int, dtype: np.dtype, entry: Path, name: str) -> None:
    """Write the packed stream one chunk of documents at a time (the directory is renamed
    into place only when whole)."""
    with fsutil.atomic_dir(entry) as tmp, open(tmp / name, "wb") as f:
        for shard, digest in zip(shards, digests, strict=True):
            for tokens in token_chunks(shard):
                f.write(_packed(tokens, eos_id, dtype).tobytes())
            if hashing.file_digest(shard) != digest:  # the cache must hold exactly the bytes its key names
                raise StageError(f"{shard} changed while the token cache was built; run the stage again")


class BatchSource(Protocol):
    """Where the training loop's batches come from: rows ``[lo, hi)`` of step ``step``'s batch, as
    arrays named ``fields``, and where a step starts (a checkpoint's loader position). The
    pretraining :class:`Loader`, or a fine-tune's rows (marin.instruct.sft.Rows)."""

    fields: ClassVar[tuple[str, ...]]

    @property
    def batch_size(self) -> int: ...

    def position(self, step: int) -> LoaderPosition: ...

    def rows(self, step: int, lo: int, hi: int) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class Loader:
    """Batches of (inputs, targets) for any step, from the packed stream (no state: resume is ``batch(step)``)."""

    stream: TokenStream
    seq_len: int
    batch_size: int
    key: bytes  # the data-order key, derived from the root seed by name
    fields: ClassVar[tuple[str, ...]] = ("inputs", "targets")

    @property
    def windows(self) -> int:
        return (len(self.stream) - 1) // self.seq_len

    def position(self, step: int) -> LoaderPosition:
        """Where step ``step`` starts: epoch and position within the epoch."""
        g = step * self.batch_size
        return {"epoch": g // self.windows, "index": g % self.windows}

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """inputs and targets, each (B, T) int32, for optimizer step ``step``."""
        return self.rows(step, 0, self.batch_size)

    def rows(self, step: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows ``[lo, hi)`` of step ``step``'s batch, reading only their windows: the part of
        the global batch one process (or device) holds."""
        if self.windows < 1:
            raise ValueError(f"the token stream ({len(self.stream)} tokens) is shorter than one sequence")
        ws = sample_windows(step, self.batch_size, self.windows, self.key)[lo:hi]
        x = np.stack([self.stream.read(*window_bounds(int(w), self.seq_len)) for w in ws])  # (hi - lo, T + 1)
        return {"inputs": x[:, :-1], "targets": x[:, 1:]}
