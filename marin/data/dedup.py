"""Exact and near-duplicate removal.

Exact: sha256 of the normalized text. Near: MinHash over word shingles with LSH
(Broder 1997; Leskovec et al., "Mining of Massive Datasets", ch. 3) via ``datasketch``,
with a fixed hash seed, so the same documents in the same order give the same result.
"""

from __future__ import annotations

import re

import numpy as np
from datasketch import MinHash, MinHashLSH

from marin.config import NearDedup

_WORD = re.compile(r"\w+")
MINHASH_SEED = 1  # datasketch's permutation seed; fixed so results never vary


def shingles(text: str, k: int) -> list[bytes]:
    words = _WORD.findall(text.lower())
    if len(words) < k:
        return [" ".join(words).encode()]
    return [" ".join(words[i : i + k]).encode() for i in range(len(words) - k + 1)]


def minhash(text: str, p: NearDedup) -> MinHash:
    m = MinHash(num_perm=p.num_perm, seed=MINHASH_SEED)
    m.update_batch(shingles(text, p.shingle_words))
    return m


class NearDuplicateIndex:
    """Insert documents in a fixed order; each is checked against all earlier ones."""

    def __init__(self, p: NearDedup):
        self.p = p
        self.lsh = MinHashLSH(threshold=p.threshold, num_perm=p.num_perm)
        self.hashes: dict[str, MinHash] = {}

    def add(self, key: str, text: str) -> tuple[str, float] | None:
        """Index ``text`` under ``key``, unless it near-duplicates an earlier document:
        then return (that document's key, estimated Jaccard similarity) and skip it."""
        m = minhash(text, self.p)
        candidates = sorted(self.lsh.query(m))
        best = None
        for c in candidates:  # LSH is a filter; confirm with the Jaccard estimate
            j = float(np.float64(m.jaccard(self.hashes[c])))
            if j >= self.p.threshold and (best is None or j > best[1]):
                best = (c, j)
        if best is not None:
            return best
        self.lsh.insert(key, m)
        self.hashes[key] = m
        return None
