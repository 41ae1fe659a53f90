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


def write_shard(folder: Path, name: str, tokens: np.ndarray) -> dict[str, int]:
    """``tokens`` (SEP-separated documents), their suffix array and where each first token's suffixes
    start in it, as ``<name>.tokens.u32``, ``<name>.sa.i32`` and ``<name>.first.i64`` in ``folder``."""
    t = tokens.astype(TOKENS_DTYPE)
    t.tofile(folder / f"{name}.tokens.u32")
    suffix_array(t).tofile(folder / f"{name}.sa.i32")
    counts = np.bincount(t[t != SEP].astype(np.int64), minlength=FIRST_IDS)
    np.concatenate([[0], np.cumsum(counts)]).astype(FIRST_DTYPE).tofile(folder / f"{name}.first.i64")
    return {"tokens": len(t)}


class Shard:
    """A shard on disk, memory-mapped: only the pages a search touches are read."""

    def __init__(self, folder: Path, name: str):
        # plain arrays over the maps (np.asarray: no copy), without memmap's per-index overhead
        self.tokens = np.asarray(_map(folder / f"{name}.tokens.u32", TOKENS_DTYPE))
        self.sa = np.asarray(_map(folder / f"{name}.sa.i32", SA_DTYPE))
        self.first = np.asarray(_map(folder / f"{name}.first.i64", FIRST_DTYPE))
        self.n = len(self.tokens)

    def _windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        idx = starts.astype(np.int64)[:, None] + np.arange(width, dtype=np.int64)
        inside = idx < self.n
        return np.where(inside, self.tokens[np.minimum(idx, max(self.n - 1, 0))].astype(np.int64), END)

    def compare(self, starts: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the sign of (query - suffix at ``starts``) and their common prefix length. Compared a
        few tokens first, then 4 times as many for the rows still equal: most differ within the first few
        (a whole window of every row each step cost 6 ms a query on a shard of 4 M tokens)."""
        rows_n, width = queries.shape
        sign = np.zeros(rows_n, dtype=np.int64)
        lcp = np.full(rows_n, width, dtype=np.int64)
        rows, lo, step = np.arange(rows_n), 0, FIRST
        while lo < width and len(rows):
            hi = min(width, lo + step)
            win = self._windows(starts[rows].astype(np.int64) + lo, hi - lo)
            differ = win != queries[rows, lo:hi]
            some = differ.any(axis=1)
            first = np.argmax(differ, axis=1)[some]
            done = rows[some]
            sign[done] = np.sign(queries[done, lo + first] - win[some, first])
            lcp[done] = lo + first
            rows, lo, step = rows[~some], hi, step * 4
        return sign, lcp

    def lower_bound(self, queries: np.ndarray) -> np.ndarray:
        """Per query row: how many suffixes sort before it (where it would be inserted). The search
        starts within the suffixes that begin with the row's first token (the shard's first-token table):
        about log2(vocabulary) fewer steps."""
        head = queries[:, 0]
        known = (head >= 0) & (head < len(self.first) - 1)
        at = np.where(known, head, 0)
        lo = np.where(known, self.first[at], 0).astype(np.int64)
        hi = np.where(known, self.first[at + 1], self.n).astype(np.int64)
        while (open_ := lo < hi).any():
            mid = (lo + hi) // 2
            sign, _ = self.compare(self.sa[np.minimum(mid, self.n - 1)], queries)
            go_right = open_ & (sign > 0)
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(open_ & ~go_right, mid, hi)
        return lo

    def longest(self, queries: np.ndarray) -> np.ndarray:
        """Per query row (padded with BEFORE): the longest prefix of it that occurs in the shard;
        the longest match is next to the query's place in the suffix array."""
        if self.n == 0:
            return np.zeros(len(queries), dtype=np.int64)
        at = self.lower_bound(queries)
        best = np.zeros(len(queries), dtype=np.int64)
        for near in (at - 1, at):
            ok = (near >= 0) & (near < self.n)
            _, lcp = self.compare(self.sa[np.clip(near, 0, self.n - 1)], queries)
            best = np.maximum(best, np.where(ok, lcp, 0))  # padding never matches: at most the query's length
        return best

    def occurrences(self, patterns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per pattern row (padded with BEFORE): the suffix-array range [lo, hi) of its occurrences."""
        if self.n == 0:
            z = np.zeros(len(patterns), dtype=np.int64)
            return z, z
        upper = np.where(patterns == BEFORE, AFTER, patterns)
        return self.lower_bound(patterns), self.lower_bound(upper)


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
