"""Exact and near-duplicate removal, in a fixed document order, in bounded memory.

Exact: sha256 of the normalized text. Near: MinHash over word shingles with LSH
(Broder 1997; Leskovec et al., "Mining of Massive Datasets", ch. 3). Signatures are
``datasketch`` MinHashes with a fixed seed (computed per shard, in any process); the index
reproduces ``datasketch.MinHashLSH`` (its band count and width, candidates = documents
sharing all values of some band) so results are the same as with the library's index.

Both indexes keep at most ``spill_at`` entries in memory; beyond that they move them to a
SQLite database in the stage's work directory (its page cache: ``Store.cache_mib``), so
memory stays bounded (a few MB) whatever the corpus size, and only disk grows: about 100
bytes per document for exact dedup and 600 + 4·num_perm bytes per indexed document for near dedup.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from pathlib import Path

import numpy as np
from datasketch import MinHash, MinHashLSH

from marin.config import NearDedup
from marin.errors import StageError

_WORD = re.compile(r"\w+")
MINHASH_SEED = 1  # datasketch's permutation seed; fixed so results never vary
SHINGLE_BATCH = 8192  # shingles per update: bounds the num_perm x batch temporary (8 MiB at 128)
# Small enough that a corpus of a few hundred documents already spills (so peak memory does not
# grow with the corpus from there); the SQLite lookups that follow cost well under 1% of curate.
EXACT_SPILL_AT = 1 << 10  # ~200 bytes each in memory (digest, name, dict slot): ~0.2 MB
NEAR_SPILL_AT = 1 << 8  # ~2.5 kB each in memory (signature, 9 band keys): ~0.6 MB
_PERMUTATIONS: dict[int, object] = {}


def shingles(text: str, k: int) -> list[bytes]:
    words = _WORD.findall(text.lower())
    if len(words) < k:
        return [" ".join(words).encode()]
    return [" ".join(words[i : i + k]).encode() for i in range(len(words) - k + 1)]


def minhash(text: str, p: NearDedup) -> MinHash:
    """The MinHash of ``text``'s word shingles (in batches: the minimum does not depend on them)."""
    perms = _PERMUTATIONS.get(p.num_perm)
    if perms is None:
        perms = _PERMUTATIONS[p.num_perm] = MinHash(num_perm=p.num_perm, seed=MINHASH_SEED).permutations
    m = MinHash(num_perm=p.num_perm, seed=MINHASH_SEED, permutations=perms, scheme="affine32")  # pyright: ignore[reportArgumentType]
    sh = shingles(text, p.shingle_words)
    for i in range(0, len(sh), SHINGLE_BATCH):
        m.update_batch(sh[i : i + SHINGLE_BATCH])
    return m


def signature(text: str, p: NearDedup) -> np.ndarray:
    """The MinHash values of ``text`` (uint32, num_perm of them: 4 bytes each)."""
    return np.asarray(minhash(text, p).hashvalues, dtype=np.uint32)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """datasketch's estimate: the fraction of equal MinHash values."""
    return float(np.count_nonzero(a == b)) / float(len(a))


class Store:
    """The SQLite file both indexes spill to: no journal, no fsync (it is scratch, deleted
    with the work directory), a bounded page cache."""

    def __init__(self, path: Path, cache_mib: int = 2):
        self.path = path
        try:
            self.db = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise self.failed(e) from None
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE",
                       f"cache_size=-{cache_mib * 1024}", "temp_store=FILE"):
            self.create(f"PRAGMA {pragma}")

    def create(self, sql: str) -> None:
        """Run one setup statement (a pragma, a table); a failure goes through :meth:`failed`."""
        try:
            self.db.execute(sql)
        except sqlite3.Error as e:
            raise self.failed(e) from None

    def failed(self, e: sqlite3.Error) -> Exception:
        """A full disk as the OSError it is (the staged output's writer names the output);
        any other database failure as a StageError naming this file."""
        code = getattr(e, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_FULL or "disk is full" in str(e):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if code == sqlite3.SQLITE_IOERR or "disk i/o error" in str(e).lower():
            return OSError(errno.EIO, os.strerror(errno.EIO))
        return StageError(f"{self.path}: the dedup work database failed ({e}); free space on that disk "
                          "and rerun")

    def close(self) -> None:
        self.db.close()


class ExactIndex:
    """Digest → name of the first document with it."""

    def __init__(self, store: Store, table: str = "exact", spill_at: int | None = None):
        self.store, self.table, self.spill_at = store, table, spill_at or EXACT_SPILL_AT
        self.mem: dict[bytes, str] = {}
        self.spilled = False
        store.create(f"CREATE TABLE {table} (digest BLOB PRIMARY KEY, name TEXT) WITHOUT ROWID")

    def first(self, digest: bytes, name: str) -> str | None:
        """The name of an earlier document with ``digest``; else None, and ``name`` is recorded."""
        found = self.mem.get(digest)
        if found is None and self.spilled:
            try:
                row = self.store.db.execute(f"SELECT name FROM {self.table} WHERE digest = ?", (digest,)).fetchone()
            except sqlite3.Error as e:
                raise self.store.failed(e) from None
            found = row[0] if row else None
        if found is None:
            self.mem[digest] = name
            if len(self.mem) >= self.spill_at:
                self._spill()
        return found

    def _spill(self) -> None:
        try:
            db = self.store.db
            db.execute("BEGIN")
            db.executemany(f"INSERT INTO {self.table} VALUES (?, ?)", self.mem.items())
            db.execute("COMMIT")
        except sqlite3.Error as e:
            raise self.store.failed(e) from None
        self.mem.clear()
        self.spilled = True


class NearIndex:
    """Signatures inserted in a fixed order; each is checked against all earlier ones."""

    def __init__(self, p: NearDedup, store: Store, spill_at: int | None = None):
        self.p, self.store, self.spill_at = p, store, spill_at or NEAR_SPILL_AT
        lsh = MinHashLSH(threshold=p.threshold, num_perm=p.num_perm)  # its band count and width, nothing else
        self.bands, self.rows = lsh.b, lsh.r
        self.mem_docs: dict[int, tuple[str, np.ndarray]] = {}
        self.mem_bands: dict[bytes, list[int]] = {}
        self.n = 0
        self.spilled = False
        store.create("CREATE TABLE near_doc (id INTEGER PRIMARY KEY, name TEXT, sig BLOB)")
        store.create("CREATE TABLE near_band (key BLOB, id INTEGER, PRIMARY KEY (key, id)) WITHOUT ROWID")

    def _keys(self, sig: np.ndarray) -> list[bytes]:
        # band number + the band's values: equal keys <=> equal bands, no hash collisions to rule out
        r = self.rows
        return [i.to_bytes(2, "big") + sig[i * r : (i + 1) * r].tobytes() for i in range(self.bands)]

    def add(self, name: str, sig: np.ndarray) -> tuple[str, float] | None:
        """Index ``sig`` under ``name``, unless it near-duplicates an earlier document: then
        return (that document's name, estimated Jaccard similarity) and skip it."""
        keys = self._keys(sig)
        best = None
        for cname, _, csig in sorted(self._candidates(keys)):  # MinHashLSH's candidates, sorted by name
            j = jaccard(sig, csig)  # LSH is a filter; confirm with the Jaccard estimate
            if j >= self.p.threshold and (best is None or j > best[1]):
                best = (cname, j)
        if best is not None:
            return best
        self.mem_docs[self.n] = (name, sig)
        for k in keys:
            self.mem_bands.setdefault(k, []).append(self.n)
        self.n += 1
        if len(self.mem_docs) >= self.spill_at:
            self._spill()
        return None

    def _candidates(self, keys: list[bytes]) -> list[tuple[str, int, np.ndarray]]:
        ids = {i for k in keys for i in self.mem_bands.get(k, ())}
        out = [(*self.mem_docs[i][:1], i, self.mem_docs[i][1]) for i in ids]
        if self.spilled:
            db, marks = self.store.db, ",".join("?" * len(keys))
            try:
                rows = db.execute(f"SELECT d.name, d.id, d.sig FROM near_doc d WHERE d.id IN "
                                  f"(SELECT DISTINCT id FROM near_band WHERE key IN ({marks}))", keys).fetchall()
            except sqlite3.Error as e:
                raise self.store.failed(e) from None
            out += [(n, i, np.frombuffer(s, dtype=np.uint32)) for n, i, s in rows]
        return out

    def _spill(self) -> None:
        try:
            db = self.store.db
            db.execute("BEGIN")
            db.executemany("INSERT INTO near_doc VALUES (?, ?, ?)",
                           ((i, n, s.tobytes()) for i, (n, s) in self.mem_docs.items()))
            db.executemany("INSERT INTO near_band VALUES (?, ?)",
                           ((k, i) for k, ids in self.mem_bands.items() for i in ids))
            db.execute("COMMIT")
        except sqlite3.Error as e:
            raise self.store.failed(e) from None
        self.mem_docs.clear()
        self.mem_bands.clear()
        self.spilled = True
