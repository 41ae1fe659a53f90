"""An n-gram index of the training text, in bounded memory, and the test of evaluation items against it.

The field's convention (GPT-3, Brown et al. 2020, appendix C; OLMo's decontamination): text is
normalized by lowercasing (``str.casefold``) and splitting on everything that is not a letter or a
digit (Unicode ``[^\\W_]+``: punctuation, whitespace, underscores and casing are ignored); an item is
contaminated when any of its n-grams of words (n = 13 by default) occurs in any training document.
n-grams never cross a document's end. An item of fewer than n words has no n-gram and is counted
``short``: it cannot be checked this way, and is kept as clean.

Each n-gram is hashed to 64 bits (blake2b of each word, combined by a polynomial over the words
modulo 2**64): two different n-grams collide with probability about 2**-64 per pair, so over 30
million training n-grams and 100,000 item n-grams a false match has odds near 1 in 6 million.

The index is a folder of sorted runs of unique hashes (``run-NNNNN.u64``), each cut from at most
``RUN_GRAMS`` n-grams of training text; a query streams every run in chunks of ``CHUNK`` hashes and
binary-searches the items' sorted hashes in each. Memory is a batch of text, a run and the items'
hashes, whatever the corpus size (benchmarks/bench_decontaminate.py measures it at 1x and 16x).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

WORD = re.compile(r"[^\W_]+")
MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial's base, so every position's word counts
RUN_GRAMS = 1 << 20  # n-grams gathered before a run is sorted and written: 8 MiB of hashes
CHUNK = 1 << 18  # hashes of a run read at once by a query: 2 MiB


def words(text: str) -> list[str]:
    """``text`` normalized: lowercased, split on non-alphanumerics."""
    return WORD.findall(text.casefold())


def _word_hashes(ws: list[str]) -> np.ndarray:
    table = {w: int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in set(ws)}
    return np.fromiter(map(table.__getitem__, ws), dtype=np.uint64, count=len(ws))


def gram_hashes(ws: list[str], n: int) -> np.ndarray:
    """The 64-bit hashes of every n-gram of ``ws``, in order (empty below n words)."""
    if len(ws) < n:
        return np.zeros(0, dtype=np.uint64)
    h = _word_hashes(ws)
    out = np.zeros(len(ws) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):  # out = sum(h[i + k] * MULT**(n - 1 - k)) modulo 2**64
            out = out * MULT + h[k:len(h) - n + 1 + k]
    return out


def build(texts: Iterable[str], n: int, folder: Path) -> dict[str, int]:
    """Index the n-grams of ``texts`` (one document each) into sorted runs in ``folder``; counts of
    documents, words, n-grams and runs."""
    folder.mkdir(parents=True, exist_ok=True)
    pending: list[np.ndarray] = []
    held = docs = total_words = grams = runs = 0
    for text in texts:
        ws = words(text)
        docs, total_words = docs + 1, total_words + len(ws)
        g = gram_hashes(ws, n)
        grams += len(g)
        pending.append(g)
        held += len(g)
        if held >= RUN_GRAMS:
            runs = _flush(pending, folder, runs)
            held = 0
    if pending:
        runs = _flush(pending, folder, runs)
    return {"documents": docs, "words": total_words, "ngrams": grams, "runs": runs}


def _flush(pending: list[np.ndarray], folder: Path, runs: int) -> int:
    run = np.unique(np.concatenate(pending))
    pending.clear()
    run.tofile(folder / f"run-{runs:05d}.u64")
    return runs + 1


def _chunks(path: Path) -> Iterator[np.ndarray]:
    with open(path, "rb") as f:  # our own run file, written by _flush; read CHUNK hashes at a time
        while len(chunk := np.fromfile(f, dtype=np.uint64, count=CHUNK)):
            yield chunk


def found(folder: Path, queries: np.ndarray) -> np.ndarray:
    """Which of ``queries`` (any order, any repeats) occur in the index in ``folder``: a bool array."""
    uniq, inverse = np.unique(queries, return_inverse=True)
    hit = np.zeros(len(uniq), dtype=bool)
    for path in sorted(folder.glob("run-*.u64")):
        for chunk in _chunks(path):
            lo, hi = np.searchsorted(uniq, chunk[0]), np.searchsorted(uniq, chunk[-1], side="right")
            part = uniq[lo:hi]
            at = np.minimum(np.searchsorted(chunk, part), len(chunk) - 1)
            hit[lo:hi] |= chunk[at] == part
    return hit[inverse.reshape(-1)]


def contaminated(folder: Path, items: list[list[str]], n: int) -> tuple[list[bool], list[bool]]:
    """For each item (its normalized words): whether any of its n-grams is in the index, and whether
    it is shorter than n words (never contaminated then)."""
    hashes = [gram_hashes(ws, n) for ws in items]
    owner = np.repeat(np.arange(len(items)), [len(h) for h in hashes])
    hits = found(folder, np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64))
    dirty = np.zeros(len(items), dtype=bool)
    dirty[owner[hits]] = True
    return dirty.tolist(), [len(ws) < n for ws in items]
