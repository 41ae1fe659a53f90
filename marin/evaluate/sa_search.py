"""Searching the trace index's suffix array (:class:`marin.evaluate.sarray.Store`) in memory linear in the
query: per position of a text, the longest run of its tokens from there found in the index (its matching
statistics), and the range of a span's occurrences.

A query row is a run of the text's ids, ``ids[start:start + length]``, then a pad symbol: BEFORE (the row
sorts before every suffix it is a prefix of) or AFTER (after them). Rows are never materialised: a
comparison gathers the windows of the rows still equal to their suffix, at most about BUDGET symbols at a
time, so memory is a few arrays of the rows' number plus BUDGET, whatever their lengths. (The m x m matrix
of a text's suffixes this replaced took 204 MB at 5 KB of text, and asked for 67 TiB at 15 MB.)

A binary search skips what it knows (Manber and Myers' simple accelerant): every suffix between two
compared ones shares with the query at least the shorter of their common prefixes with it, so a comparison
starts there; and once the search ends, the common prefixes with the suffixes either side of the query's
place, the longest any suffix has, are the ones already measured.

The longest match at each position ``i`` takes two passes. First, each position's window of WINDOW tokens:
where its match is shorter than the window, or the window is the rest of the text, that is the match. Where
the window matches whole, the match ends no earlier than the one before (``end(i) >= end(i - 1)``: a match
from ``i - 1`` less its first token is one from ``i``). So with ``e`` the greater of that end and
``i + WINDOW``, the match is ``e - i`` unless ``ids[i:e + 1]`` occurs, which needs the window ending at
``e + 1`` to occur, as the first pass says. Only then is ``i`` searched in full (with the next positions that
may need it). A verbatim passage is one full search; text found nowhere at length is the first pass alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marin.evaluate.sarray import AFTER, BEFORE, FIRST_IDS, Store

BUDGET = 1 << 19  # symbols gathered at once over all rows: each array of them 4 MB of int64
FIRST = 8  # symbols compared first, then 4 times as many: most suffixes differ from a row within a few
WINDOW = 64  # the first pass's window, in tokens
AHEAD = 32  # the most positions searched in full together


@dataclass(frozen=True)
class Rows:
    """Query rows over one text's ids: row r is ``ids[start[r]:start[r] + length[r]]``, then ``pad``."""

    ids: np.ndarray
    start: np.ndarray
    length: np.ndarray
    pad: int

    def window(self, rows: np.ndarray, off: np.ndarray, width: int) -> np.ndarray:
        """Per row of ``rows``: its ``width`` symbols from ``off`` on (int64), ``pad`` past its end."""
        idx = off[:, None] + np.arange(width, dtype=np.int64)
        inside = idx < self.length[rows][:, None]
        at = np.minimum(self.start[rows][:, None] + idx, max(len(self.ids) - 1, 0))  # rows lie within ids
        return np.where(inside, self.ids[at], self.pad)


def compare(store: Store, pos: np.ndarray, q: Rows, rows: np.ndarray,
            skip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``rows``: the sign of (the row - the suffix at ``pos``) and their common prefix length,
    compared from ``skip`` on (they agree before it). A row's pad differs from every symbol of a suffix,
    so each comparison ends by the row's end."""
    k = len(rows)
    sign, lcp = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    live, off, step = np.arange(k), skip.astype(np.int64), FIRST
    while len(live):
        width = max(1, min(step, BUDGET // len(live)))
        suffix, row = store.window(pos[live] + off[live], width), q.window(rows[live], off[live], width)
        differ = suffix != row
        some = differ.any(axis=1)
        first = np.argmax(differ, axis=1)[some]
        done = live[some]
        sign[done] = np.sign(row[some, first] - suffix[some, first])
        lcp[done] = off[done] + first
        live = live[~some]
        off[live] += width
        step *= 4
    return sign, lcp


def lower_bound(store: Store, q: Rows) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many suffixes sort before it (where it would be inserted), and its longest common
    prefix with any suffix (that of a suffix next to its place). One binary search, started within the
    suffixes that begin with the row's first token (the first-token table)."""
    k = len(q.start)
    head = q.window(np.arange(k), np.zeros(k, dtype=np.int64), 1)[:, 0]
    known = (q.length > 0) & (head >= 0) & (head < FIRST_IDS)
    at = np.where(known, head, 0)
    lo = np.where(known, store.first[at], 0).astype(np.int64)
    hi = np.where(known, store.first[at + 1], store.n).astype(np.int64)
    floor = known.astype(np.int64)  # symbols every suffix in [lo, hi) shares with its row: the first token
    # the common prefixes with the suffixes at lo - 1 and at hi: 0 until compared (outside the first token's
    # range, or outside the array)
    left, right = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
    while len(r := np.flatnonzero(lo < hi)):
        mid = (lo[r] + hi[r]) // 2
        sign, lcp = compare(store, store.suffix(mid), q, r, np.maximum(floor[r], np.minimum(left[r], right[r])))
        up = sign > 0
        lo[r[up]], left[r[up]] = mid[up] + 1, lcp[up]
        hi[r[~up]], right[r[~up]] = mid[~up], lcp[~up]
    return lo, np.maximum(left, right)


def occurrences(store: Store, ids: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per span ``ids[start:start + length]``: the suffix-array range [lo, hi) of its occurrences."""
    lo, _ = lower_bound(store, Rows(ids, start, length, BEFORE))
    hi, _ = lower_bound(store, Rows(ids, start, length, AFTER))
    return lo, hi


def longest(store: Store, ids: np.ndarray) -> np.ndarray:
    """Per position of ``ids``: the longest run of them from there that occurs in the index (int64)."""
    m = len(ids)
    if m == 0 or store.n == 0:
        return np.zeros(m, dtype=np.int64)
    ids, pos = np.asarray(ids, dtype=np.int64), np.arange(m, dtype=np.int64)
    _, got = lower_bound(store, Rows(ids, pos, np.minimum(WINDOW, m - pos), BEFORE))
    need = (got == WINDOW) & (m - pos > WINDOW)  # the window matched whole, and the text runs on
    if not need.any():
        return got
    whole = (got == WINDOW).tolist()
    ends = np.maximum.accumulate(np.where(need, 0, pos + got)).tolist()  # the exact ends so far
    rows = np.flatnonzero(need)
    searched: dict[int, int] = {}
    e, ahead = 0, 1
    for k, i in enumerate(rows.tolist()):
        e = max(e, ends[i], i + WINDOW)  # the match from i ends at e or later
        if e >= m:  # it runs to the text's end, and so do all after it
            got[rows[k:]] = m - rows[k:]
            break
        if not whole[e + 1 - WINDOW]:  # ids[i:e + 1] cannot occur: its last WINDOW tokens do not
            got[i], ahead = e - i, 1
        else:
            if i not in searched:
                batch = rows[k:k + ahead]
                _, full = lower_bound(store, Rows(ids, batch, m - batch, BEFORE))
                searched.update(zip(batch.tolist(), full.tolist(), strict=True))
                ahead = min(2 * ahead, AHEAD)
            got[i] = searched.pop(i)
        e = i + int(got[i])
    return got
