"""Exact and near dedup: the bounded indexes give exactly the answers of a plain dict and of
datasketch's own MinHashLSH (the implementation before streaming), spilled to SQLite or not."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from marin.config import NearDedup
from marin.data import dedup
from marin.errors import StageError
from tests.conftest import make_text

P = NearDedup(enabled=True, num_perm=128, threshold=0.8, shingle_words=5)


class ReferenceNear:
    """The near-dedup index as it was: datasketch's MinHashLSH and MinHash objects in memory."""

    def __init__(self, p: NearDedup):
        self.p, self.lsh, self.hashes = p, MinHashLSH(threshold=p.threshold, num_perm=p.num_perm), {}

    def add(self, key: str, text: str) -> tuple[str, float] | None:
        m = MinHash(num_perm=self.p.num_perm, seed=dedup.MINHASH_SEED)
        m.update_batch(dedup.shingles(text, self.p.shingle_words))
        best = None
        for c in sorted(self.lsh.query(m)):
            j = float(np.float64(m.jaccard(self.hashes[c])))
            if j >= self.p.threshold and (best is None or j > best[1]):
                best = (c, j)
        if best is not None:
            return best
        self.lsh.insert(key, m)
        self.hashes[key] = m
        return None


def corpus(n: int = 60, seed: int = 3) -> list[tuple[str, str]]:
    """Documents in a fixed order: originals, copies with one to four lines changed (Jaccard
    from near 1 down past the threshold), and exact copies."""
    rng = random.Random(seed)
    docs: list[tuple[str, str]] = []
    for i in range(n):
        if docs and rng.random() < 0.5:
            name, text = rng.choice(docs)
            lines = text.split("\n")
            for _ in range(rng.randint(0, 4)):
                k = rng.randrange(len(lines))
                lines[k] = make_text(rng, 1).strip()
            docs.append((f"d{i:03d}-from-{name}", "\n".join(lines)))
        else:
            docs.append((f"d{i:03d}", make_text(rng, 30)))
    return docs


def test_signature_is_datasketchs_minhash(monkeypatch: pytest.MonkeyPatch) -> None:
    text = make_text(random.Random(1), 80)
    m = MinHash(num_perm=P.num_perm, seed=dedup.MINHASH_SEED)
    m.update_batch(dedup.shingles(text, P.shingle_words))
    sig = dedup.signature(text, P)
    assert sig.dtype == np.uint32 and np.array_equal(sig, m.hashvalues)
    monkeypatch.setattr(dedup, "SHINGLE_BATCH", 7)  # the minimum does not depend on the batches
    assert np.array_equal(dedup.signature(text, P), sig)


def test_bands_are_minhashlshs() -> None:
    idx = dedup.NearIndex(P, dedup.Store(Path(":memory:")))
    lsh = MinHashLSH(threshold=P.threshold, num_perm=P.num_perm)
    assert (idx.bands, idx.rows) == (lsh.b, lsh.r) == (9, 13)


@pytest.mark.parametrize("spill_at", [1, 3, 10**6])
def test_near_index_answers_as_minhashlsh(tmp_path: Path, spill_at: int) -> None:
    docs = corpus()
    ref = ReferenceNear(P)
    idx = dedup.NearIndex(P, dedup.Store(tmp_path / "d.sqlite"), spill_at=spill_at)
    expected = [ref.add(name, text) for name, text in docs]
    got = [idx.add(name, dedup.signature(text, P)) for name, text in docs]
    assert got == expected
    found = [e for e in expected if e is not None]
    assert len(found) >= 10 and any(j < 1.0 for _, j in found)  # the test corpus has real near duplicates
    assert idx.spilled == (spill_at < len(docs))


@pytest.mark.parametrize("spill_at", [1, 2, 10**6])
def test_exact_index_first_occurrence_wins(tmp_path: Path, spill_at: int) -> None:
    idx = dedup.ExactIndex(dedup.Store(tmp_path / "d.sqlite"), spill_at=spill_at)
    digests = [bytes([i % 5]) * 32 for i in range(12)]  # five distinct digests, each seen again
    got = [idx.first(d, f"doc{i}") for i, d in enumerate(digests)]
    assert got == [None] * 5 + [f"doc{i % 5}" for i in range(5, 12)]
    assert len(idx.mem) < spill_at or spill_at > 12
    assert idx.spilled == (spill_at <= 5)


def test_a_failing_store_is_one_stage_error(tmp_path: Path) -> None:
    store = dedup.Store(tmp_path / "d.sqlite")
    idx = dedup.ExactIndex(store, spill_at=1)
    idx.first(b"a" * 32, "doc0")
    store.close()
    with pytest.raises(StageError, match=r"d.sqlite: the dedup work database failed .*free space"):
        idx.first(b"b" * 32, "doc1")
