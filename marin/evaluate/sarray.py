"""Suffix arrays over token ids, built and searched with numpy alone (``pydivsufsort`` is not in the
locked environment), the structure infini-gram and OLMoTrace search.

The index's tokens are its documents' token ids, each document followed by ``SEP`` (larger than every
token id), stored ``<u4``. Its suffix array is every suffix's start in the order of the suffixes read up
to their document's end: each ``SEP`` counts as a symbol of its own, above every token and ordered by
position, so two suffixes equal up to their documents' ends sort by position. No comparison runs past a
document's end (a match never does: a query holds no ``SEP``), the order is unique, and it depends on the
tokens alone, not on how they were cut into shards: the same tokens give the same bytes on every machine.

Construction is prefix doubling (Manber and Myers 1993), a shard at a time: suffixes ranked by their
first ``k`` tokens, then by pairs of ranks ``(rank[i], rank[i + k])`` for ``2k``, until every rank is
distinct, so ``ceil(log2(longest repeat))`` sorts of the shard; memory is a few int64 arrays of the
shard's length, whatever the corpus. The shards' arrays are then merged into one
(:mod:`marin.evaluate.sa_merge`), so a search is one binary search whatever the number of shards.

The searches, in memory linear in the query, are :mod:`marin.evaluate.sa_search`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

SEP = 0xFFFFFFFF  # ends every document; above every token id (tokens are uint16 in data/tokens)
TOKEN_LIMIT = 0xFFFF  # token ids must be below it: a key lane holds a token, and 0xFFFF stands for SEP
TOKENS_DTYPE, SHARD_SA_DTYPE = np.dtype("<u4"), np.dtype("<i4")
BEFORE, AFTER = -2, 1 << 40  # query padding: sorts before every continuation, or after every one
END = -1  # past a document's SEP, or past the last token: before every token
FIRST_IDS, FIRST_DTYPE = 1 << 16, np.dtype("<i8")  # the table of where each first token's suffixes start
KEY_TOKENS, LANES = 8, 4  # a suffix's key: its first 8 tokens, 4 16-bit lanes to a uint64 column
KEY_DTYPE = np.dtype("<u8")
TOKENS_FILE, FIRST_FILE = "tokens.u32", "first.i64"


def sa_dtype(n: int) -> np.dtype:
    """The suffix array's entries for ``n`` tokens: 4 bytes while positions fit, else 8."""
    return np.dtype("<i4") if n < 1 << 31 else np.dtype("<i8")


def sa_file(n: int) -> str:
    return "sa.i32" if sa_dtype(n).itemsize == 4 else "sa.i64"


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """The suffix array of ``tokens`` (int64 starts; each SEP a symbol of its own, by position)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.asarray(tokens).astype(np.int64)
    sep = first == SEP
    first[sep] = SEP + np.arange(int(sep.sum()))  # distinct, above every token, in position order
    rank = np.unique(first, return_inverse=True)[1].astype(np.int64).reshape(-1)
    del first, sep
    k = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)  # rank of the suffix k tokens on; -1 past the end
        second[:n - k] = rank[k:]
        key = rank * (n + 1) + (second + 1)  # < (n+1)**2: exact in int64 below 3e9 tokens a shard
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        new = np.empty(n, dtype=np.int64)
        new[order] = np.cumsum(np.concatenate([[0], sorted_key[1:] != sorted_key[:-1]]))
        rank = new
        if rank[order[-1]] == n - 1 or k >= n:  # every rank distinct: the order is final
            return order
        k *= 2


def symbols(tokens: np.ndarray, pos: np.ndarray, off: int, width: int) -> np.ndarray:
    """Row i: ``width`` symbols of the suffix at ``pos[i]`` from ``off`` on (int64): its tokens, SEP at its
    document's end, END after it and past the last token. The caller knows no row has a SEP before ``off``."""
    n = len(tokens)
    idx = pos.astype(np.int64)[:, None] + off + np.arange(width, dtype=np.int64)
    sym = np.where(idx < n, tokens[np.minimum(idx, max(n - 1, 0))].astype(np.int64), END) if n else \
        np.full(idx.shape, END, dtype=np.int64)
    seen = np.maximum.accumulate(sym == SEP, axis=1)
    sym[:, 1:][seen[:, :-1]] = END
    return sym


def pack(sym: np.ndarray) -> np.ndarray:
    """Symbols as uint64 columns of 4 16-bit lanes, first symbol highest, so that the columns compare as
    the symbols do: a token as itself, SEP as 0xFFFF, END as 0 (END only follows a SEP, which decides
    first)."""
    rows, width = sym.shape
    lane = np.where(sym == SEP, 0xFFFF, np.maximum(sym, 0)).astype(np.uint64)
    lane = np.pad(lane, ((0, 0), (0, -width % LANES))).reshape(rows, -1, LANES)
    return (lane[..., 0] << 48) | (lane[..., 1] << 32) | (lane[..., 2] << 16) | lane[..., 3]


def ended(cols: np.ndarray) -> np.ndarray:
    """Per row of packed columns: whether it holds a SEP (the suffix's document ends within it)."""
    lanes = np.stack([(cols >> s) & 0xFFFF for s in (48, 32, 16, 0)], axis=-1)
    return (lanes == 0xFFFF).any(axis=(1, 2))


def shard_keys(tokens: np.ndarray, sa: np.ndarray) -> np.ndarray:
    """Each suffix's key (:func:`pack` of its first KEY_TOKENS symbols), in suffix-array order: (n, 2)
    uint64; computed in position order (a pass over the tokens a symbol), then gathered once."""
    n = len(tokens)
    keys = np.zeros((n, KEY_TOKENS // LANES), dtype=np.uint64)
    seen = np.zeros(n, dtype=bool)  # the suffix's SEP already read: END (0) from here on
    for j in range(KEY_TOKENS):
        sym = np.full(n, END, dtype=np.int64)
        sym[:max(n - j, 0)] = tokens[j:]
        sep = sym == SEP
        lane = np.where(seen, 0, np.where(sep, 0xFFFF, np.maximum(sym, 0))).astype(np.uint64)
        keys[:, j // LANES] |= lane << (16 * (LANES - 1 - j % LANES))
        seen |= sep
    return keys[sa]


def append_shard(folder: Path, work: Path, tokens: np.ndarray) -> int:
    """Append a shard: its tokens (SEP-separated documents) to ``folder/tokens.u32``; its suffix array
    (positions within the shard) and its suffixes' keys to ``work``, for the merge; its length."""
    t = tokens.astype(TOKENS_DTYPE)
    sa = suffix_array(t)
    for path, data in ((folder / TOKENS_FILE, t), (work / "sa.i32", sa.astype(SHARD_SA_DTYPE)),
                       (work / "keys.u64", shard_keys(t, sa).astype(KEY_DTYPE))):
        with open(path, "ab") as f:
            write_array(f, data)
    return len(t)


def write_array(f: BinaryIO, data: np.ndarray) -> None:
    """``data``'s bytes written to ``f``: a full disk raises the system's error (ENOSPC), where numpy's
    ``tofile`` says only "N requested and M written"."""
    f.write(np.ascontiguousarray(data).data)


def first_table(counts: np.ndarray) -> np.ndarray:
    """Where the suffixes of each first token start in the suffix array, from each token's count."""
    c = np.zeros(FIRST_IDS, dtype=np.int64)
    c[:len(counts)] = counts[:FIRST_IDS]
    return np.concatenate([[0], np.cumsum(c)]).astype(FIRST_DTYPE)


class Store:
    """The index's tokens and its one suffix array, memory-mapped (only the pages a search touches are
    read). A comparison with a query always ends at or before the suffix's document's SEP (a query holds
    none), so a window may run on past it unmasked."""

    def __init__(self, folder: Path, tokens: int):
        # plain arrays over the maps (np.asarray: no copy), without memmap's per-index overhead
        self.tokens = np.asarray(_map(folder / TOKENS_FILE, TOKENS_DTYPE))
        self.sa = np.asarray(_map(folder / sa_file(tokens), sa_dtype(tokens)))
        self.first = np.asarray(_map(folder / FIRST_FILE, FIRST_DTYPE))
        self.n = len(self.sa)

    def window(self, starts: np.ndarray, width: int) -> np.ndarray:
        """Row i: ``width`` tokens from ``starts[i]`` on (int64), END past the last token; unmasked past a SEP."""
        idx = starts[:, None] + np.arange(width, dtype=np.int64)
        inside = idx < len(self.tokens)
        return np.where(inside, self.tokens[np.minimum(idx, max(len(self.tokens) - 1, 0))].astype(np.int64), END)

    def suffix(self, at: np.ndarray) -> np.ndarray:
        """Where the suffix at rank ``at`` (clipped into the array) starts in ``tokens``."""
        return self.sa[np.clip(at, 0, max(self.n - 1, 0))].astype(np.int64)


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
