"""The shards' suffix arrays (:mod:`marin.evaluate.sarray`) merged into one suffix array of the whole
index, in memory bounded by a merge block, so that a search is one binary search whatever the corpus.

Each shard left, beside its tokens in ``tokens.u32``, its suffix array (positions within the shard) and
each suffix's key (its first 8 symbols, packed) in a work folder. The merge is a k-way merge of the
sorted shards, a block at a time:

- Each shard offers its next ``m = block // shards`` suffixes. The smallest of the suffixes just past
  those (one per shard that has more) is the pivot; a binary search in each shard's offer finds how many
  of its suffixes sort before the pivot. Those suffixes, at most ``block`` of them and at least ``m``,
  are exactly the next ones of the merged order.
- They are ordered by their keys (a stable sort of the shards' sorted runs by the first 4 tokens, then
  the next 4 within ties), then, only for the groups of equal keys that mix shards and have not reached
  their documents' ends, by the next tokens, read from ``tokens.u32`` (twice as many each round). A
  group from one shard is already in order, since a shard's order is the merged order restricted to it;
  equal suffixes (up to their documents' ends) keep the shards' order, which is the order of position.

The merged array is the suffix array of the whole token file (what :func:`sarray.suffix_array` gives for
it at once). The block's arrays are read with ``np.fromfile`` and the token file is mapped a few thousand
rows at a time, so the merge's resident memory is bounded by the block, not by the corpus. Work: every
suffix is sorted once inside its block; each block reads ``m + 1`` suffixes of every shard (those it does
not take are read again by the next block: about twice each when the shards are alike, up to ``shards``
times for a shard whose suffixes all sort last), adds a binary search of ``log2(m)`` steps over the shards,
and reads a window a round for the rows of mixed-shard groups of equal keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marin.evaluate import sarray

BATCH = 4096  # rows read through one mapping of the token file (its resident pages: a few per row)
WINDOW_CAP = 1 << 22  # symbols read at once in a refinement round


class Tokens:
    """The token file, read a batch of suffix windows at a time through a mapping dropped after each
    batch (mapped pages count as the process's memory while mapped)."""

    def __init__(self, path: Path):
        self.path, self.n = path, path.stat().st_size // sarray.TOKENS_DTYPE.itemsize

    def symbols(self, pos: np.ndarray, off: int, width: int) -> np.ndarray:
        out = np.empty((len(pos), width), dtype=np.int64)
        for i in range(0, len(pos), BATCH):
            mapped = np.memmap(self.path, dtype=sarray.TOKENS_DTYPE, mode="r") if self.n else \
                np.zeros(0, dtype=sarray.TOKENS_DTYPE)
            out[i:i + BATCH] = sarray.symbols(mapped, pos[i:i + BATCH], off, width)
            del mapped
        return out


def order(tokens: Tokens, pos: np.ndarray, shard: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The permutation that puts suffixes ``pos`` (global starts; from shards ``shard``; keys ``keys``)
    in the index's order. The rows come in shard order, each shard's rows in its own order."""
    perm = np.argsort(keys[:, 0], kind="stable")  # the shards' rows are sorted runs: a merge of runs
    cols = keys[perm, :1]
    gid = np.cumsum(np.concatenate([[True], cols[1:, 0] != cols[:-1, 0]])) - 1
    open_ = _open(gid, shard[perm], cols)
    off, width = sarray.LANES, sarray.KEY_TOKENS
    while open_.any():
        rows = np.nonzero(open_)[0]  # whole groups, each a run of positions of perm
        if off < sarray.KEY_TOKENS:  # the keys' second column first, then the tokens themselves
            cols, off = keys[perm[rows], 1:], sarray.KEY_TOKENS
        else:
            cols = sarray.pack(tokens.symbols(pos[perm[rows]], off, width))
            off, width = off + width, max(sarray.KEY_TOKENS, min(2 * width, WINDOW_CAP // len(rows)))
        sub = np.lexsort((*cols.T[::-1], gid[rows]))  # within each group (gid first), by the next symbols
        perm[rows] = perm[rows][sub]
        cols, g = cols[sub], gid[rows][sub]
        new = np.cumsum(np.concatenate([[True], (g[1:] != g[:-1]) | (cols[1:] != cols[:-1]).any(axis=1)]))
        gid[rows] = gid.max() + new
        open_[rows] = _open(gid[rows], shard[perm[rows]], cols)
    return perm


def _open(gid: np.ndarray, shard: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Per row (``gid`` ascending, one id per group of equal symbols so far, the last of them packed in
    ``cols``): whether its group needs more symbols: 2 rows or more, from more than one shard, and no SEP
    read yet (a group's rows are equal, up to their documents' ends when a SEP was read)."""
    if len(gid) == 0:
        return np.zeros(0, dtype=bool)
    starts = np.nonzero(np.concatenate([[True], gid[1:] != gid[:-1]]))[0]
    size = np.diff(np.append(starts, len(gid)))
    mixed = np.minimum.reduceat(shard, starts) != np.maximum.reduceat(shard, starts)
    need = (size > 1) & mixed
    need[need] = ~sarray.ended(cols[starts[need]])
    return np.repeat(need, size)


@dataclass(frozen=True)
class Offer:
    """The next suffixes of every shard: global starts, keys, and where each shard's run begins."""

    pos: np.ndarray
    keys: np.ndarray
    at: np.ndarray  # shard s's run is pos[at[s]:at[s + 1]]


class Shards:
    """The shards' suffix arrays and keys in the work folder, read a run at a time (not mapped)."""

    def __init__(self, work: Path, sizes: list[int]):
        self.work, self.size = work, np.array(sizes, dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)

    def offer(self, cur: np.ndarray, count: int) -> Offer:
        """Up to ``count`` suffixes of each shard from rank ``cur[s]`` on."""
        pos, keys = [], []
        with open(self.work / "sa.i32", "rb") as fs, open(self.work / "keys.u64", "rb") as fk:
            for s, c in enumerate(cur.tolist()):
                n, at = max(0, int(min(count, self.size[s] - c))), int(self.base[s]) + c
                fs.seek(sarray.SHARD_SA_DTYPE.itemsize * at)
                fk.seek(2 * sarray.KEY_DTYPE.itemsize * at)
                pos.append(int(self.base[s]) + np.fromfile(fs, sarray.SHARD_SA_DTYPE, n).astype(np.int64))
                keys.append(np.fromfile(fk, sarray.KEY_DTYPE, 2 * n).astype(np.uint64).reshape(n, 2))
        return Offer(np.concatenate(pos), np.concatenate(keys),
                     np.concatenate([[0], np.cumsum([len(p) for p in pos])]).astype(np.int64))


def merge(tokens_path: Path, work: Path, sizes: list[int], out: Path, block: int) -> None:
    """Write to ``out`` the suffix array of ``tokens_path`` (entries ``sarray.sa_dtype``) from its shards'
    arrays and keys in ``work`` (shard lengths ``sizes``), ``block`` suffixes at most in memory at once."""
    shards, tokens = Shards(work, sizes), Tokens(tokens_path)
    dtype, k = sarray.sa_dtype(int(shards.base[-1])), len(sizes)
    m = max(1, block // max(k, 1))
    cur = np.zeros(k, dtype=np.int64)
    with open(out, "wb") as f:
        while (cur < shards.size).any():
            offer = shards.offer(cur, m + 1)
            # one shard is in order already
            take = np.minimum(shards.size - cur, m) if k == 1 else _cut(tokens, shards, offer, cur, m)
            sel = np.concatenate([np.arange(offer.at[s], offer.at[s] + take[s]) for s in range(k)])
            pos = offer.pos[sel]
            if k > 1:
                pos = pos[order(tokens, pos, np.repeat(np.arange(k), take), offer.keys[sel])]
            sarray.write_array(f, pos.astype(dtype))
            cur += take


def _cut(tokens: Tokens, shards: Shards, offer: Offer, cur: np.ndarray, m: int) -> np.ndarray:
    """How many of each shard's offered suffixes come next in the merged order: those before the pivot,
    the smallest of the suffixes just past each shard's first ``m``; all that are left when no shard has
    more than ``m``."""
    left = shards.size - cur
    live = np.nonzero(left > m)[0]
    if len(live) == 0:
        return left
    cand = offer.at[live] + m
    first = int(order(tokens, offer.pos[cand], live, offer.keys[cand])[0])
    p, pivot = int(live[first]), int(cand[first])
    lo, hi = np.zeros(len(left), dtype=np.int64), np.minimum(left, m)
    lo[p] = hi[p] = m  # the pivot's shard: its first m, all before the pivot
    while len(active := np.nonzero(lo < hi)[0]):
        mid = (lo[active] + hi[active]) // 2
        sh = np.append(active, p)
        rows = np.append(offer.at[active] + mid, pivot)[np.argsort(sh)]  # in shard order: distinct shards
        sh = np.sort(sh)
        rank = np.empty(len(rows), dtype=np.int64)
        rank[order(tokens, offer.pos[rows], sh, offer.keys[rows])] = np.arange(len(rows))
        before = rank[np.searchsorted(sh, active)] < rank[np.searchsorted(sh, p)]
        lo[active] = np.where(before, mid + 1, lo[active])
        hi[active] = np.where(before, hi[active], mid)
    return lo
