"""Suffix arrays over token ids, built and searched with numpy alone (``pydivsufsort`` is not in the
locked environment), the structure infini-gram and OLMoTrace search.

A shard is its documents' token ids, each document followed by ``SEP`` (larger than every token id:
a match never runs across a document's end, since a query holds no ``SEP``), stored ``<u4``; its
suffix array is every suffix's start, in lexicographic order of the suffixes, stored ``<i4``. The end
of the shard sorts before every token, so no two suffixes are equal and the order is unique: the same
tokens give the same bytes on every machine.

Construction is prefix doubling (Manber and Myers 1993): suffixes ranked by their first ``k`` tokens,
then by pairs of ranks ``(rank[i], rank[i + k])`` for ``2k``, until every rank is distinct, so
``ceil(log2(longest repeat))`` sorts of the shard; memory is a few int64 arrays of the shard's length,
whatever the corpus (benchmarks/bench_trace.py measures it).

A search takes many query suffixes at once: each step of the binary search gathers, for every query,
the window of tokens at its middle suffix and compares it with the query in one numpy operation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEP = 0xFFFFFFFF  # ends every document in a shard; above every token id (tokens are uint16 in data/tokens)
TOKENS_DTYPE, SA_DTYPE = np.dtype("<u4"), np.dtype("<i4")
BEFORE, AFTER = -2, 1 << 40  # query padding: sorts before every continuation, or after every one
END = -1  # past the shard's last token: before every token
FIRST = 8  # tokens compared first in a search step
FIRST_IDS, FIRST_DTYPE = 1 << 16, np.dtype("<i8")  # a shard's table of where each first token's suffixes start


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """The suffix array of ``tokens`` (int32 starts, suffixes in lexicographic order, end lowest)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=SA_DTYPE)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64).reshape(-1)
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
            return order.astype(SA_DTYPE)
        k *= 2


TOKENS_FILE, SA_FILE, FIRST_FILE = "tokens.u32", "sa.i32", "first.i64"


def append_shard(folder: Path, tokens: np.ndarray) -> int:
    """Append a shard to the index in ``folder``: its tokens (SEP-separated documents) to ``tokens.u32``,
    its suffix array (positions within the shard) to ``sa.i32``, and where each first token's suffixes
    start in it to ``first.i64``; its length."""
    t = tokens.astype(TOKENS_DTYPE)
    counts = np.bincount(t[t != SEP].astype(np.int64), minlength=FIRST_IDS)[:FIRST_IDS]
    for name, data in ((TOKENS_FILE, t), (SA_FILE, suffix_array(t)),
                       (FIRST_FILE, np.concatenate([[0], np.cumsum(counts)]).astype(FIRST_DTYPE))):
        with open(folder / name, "ab") as f:
            data.tofile(f)
    return len(t)


class Store:
    """Every shard of an index, memory-mapped (only the pages a search touches are read), searched at once:
    each search step compares every (query row, shard) pair in one numpy operation, so the cost per shard
    is its rows' tokens, not a round of calls (one shard a call cost 0.6 ms a query whatever its size)."""

    def __init__(self, folder: Path, sizes: list[int]):
        # plain arrays over the maps (np.asarray: no copy), without memmap's per-index overhead
        self.tokens = np.asarray(_map(folder / TOKENS_FILE, TOKENS_DTYPE))
        self.sa = np.asarray(_map(folder / SA_FILE, SA_DTYPE))
        self.first = np.asarray(_map(folder / FIRST_FILE, FIRST_DTYPE)).reshape(len(sizes), FIRST_IDS + 1)
        self.size = np.array(sizes, dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)

    def _windows(self, starts: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
        idx = starts[:, None] + np.arange(width, dtype=np.int64)
        inside = idx < ends[:, None]
        return np.where(inside, self.tokens[np.minimum(idx, max(len(self.tokens) - 1, 0))].astype(np.int64), END)

    def compare(self, starts: np.ndarray, ends: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the sign of (query - the suffix at ``starts``, its shard ending at ``ends``) and their
        common prefix length. Compared a few tokens first, then 4 times as many for the rows still equal:
        most differ within the first few (a whole window of every row each step cost 6 ms a query on a
        shard of 4 M tokens)."""
        rows_n, width = queries.shape
        sign = np.zeros(rows_n, dtype=np.int64)
        lcp = np.full(rows_n, width, dtype=np.int64)
        rows, lo, step = np.arange(rows_n), 0, FIRST
        while lo < width and len(rows):
            hi = min(width, lo + step)
            win = self._windows(starts[rows] + lo, ends[rows], hi - lo)
            differ = win != queries[rows, lo:hi]
            some = differ.any(axis=1)
            first = np.argmax(differ, axis=1)[some]
            done = rows[some]
            sign[done] = np.sign(queries[done, lo + first] - win[some, first])
            lcp[done] = lo + first
            rows, lo, step = rows[~some], hi, step * 4
        return sign, lcp

    def suffix(self, shard: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Where the suffix at rank ``at`` (clipped into the shard) of each row's shard starts in ``tokens``."""
        b = self.base[shard]
        return b + self.sa[b + np.clip(at, 0, self.size[shard] - 1)].astype(np.int64)

    def lower_bound(self, queries: np.ndarray, shard: np.ndarray) -> np.ndarray:
        """Per row: how many suffixes of its shard sort before its query (where it would be inserted). The
        search starts within the suffixes that begin with the query's first token (the shard's first-token
        table): about log2(vocabulary) fewer steps."""
        head = queries[:, 0]
        known = (head >= 0) & (head < FIRST_IDS)
        at = np.where(known, head, 0)
        lo = np.where(known, self.first[shard, at], 0).astype(np.int64)
        hi = np.where(known, self.first[shard, at + 1], self.size[shard]).astype(np.int64)
        ends = self.base[shard + 1]
        while (open_ := lo < hi).any():
            mid = (lo + hi) // 2
            sign, _ = self.compare(self.suffix(shard, mid), ends, queries)
            go_right = open_ & (sign > 0)
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(open_ & ~go_right, mid, hi)
        return lo

    def _pairs(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (query row, shard) pair: the rows repeated per shard, and each pair's shard."""
        q, s = len(queries), len(self.size)
        return np.tile(queries, (s, 1)), np.repeat(np.arange(s), q)

    def longest(self, queries: np.ndarray) -> np.ndarray:
        """Per query row (padded with BEFORE): the longest prefix of it that occurs in any shard; in a
        shard, the longest match is next to the query's place in the suffix array."""
        rows, shard = self._pairs(queries)
        at = self.lower_bound(rows, shard)
        best = np.zeros(len(rows), dtype=np.int64)
        for near in (at - 1, at):
            ok = (near >= 0) & (near < self.size[shard])
            _, lcp = self.compare(self.suffix(shard, near), self.base[shard + 1], rows)
            best = np.maximum(best, np.where(ok, lcp, 0))  # padding never matches: at most the query's length
        return best.reshape(len(self.size), len(queries)).max(axis=0, initial=0)

    def occurrences(self, patterns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per shard and pattern row (padded with BEFORE): the suffix-array range [lo, hi) of its occurrences
        in the shard, as two (shards, patterns) arrays."""
        rows, shard = self._pairs(patterns)
        upper = np.where(rows == BEFORE, AFTER, rows)
        shape = (len(self.size), len(patterns))
        return self.lower_bound(rows, shard).reshape(shape), self.lower_bound(upper, shard).reshape(shape)


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def suffix_rows(ids: np.ndarray, width: int | None = None) -> np.ndarray:
    """Row i: ``ids[i:]`` padded with BEFORE to ``width`` (default len(ids)); int64."""
    m = len(ids)
    w = m if width is None else width
    idx = np.arange(m)[:, None] + np.arange(w)
    return np.where(idx < m, np.asarray(ids, dtype=np.int64)[np.minimum(idx, max(m - 1, 0))], BEFORE)
