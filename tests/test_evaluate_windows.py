"""Evaluation's pure pieces: the windows of one document, streamed scoring and the streamed
unigram baseline, each bit for bit equal to a straightforward all-in-memory version."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin.data import documents as dd
from marin.evaluate import scoring as ev

EOS, T = 0, 8


@pytest.mark.parametrize("n", [0, 1, T - 1, T, T + 1, 3 * T + 5])
def test_every_token_is_predicted_once_from_its_own_document(n: int) -> None:
    ids = np.arange(1, n + 1, dtype=np.int32) * 3  # distinct, never EOS
    seq = [EOS, *ids.tolist()]
    ws = list(dd.windows(ids, EOS, T))
    assert len(ws) == -(-n // T)  # ceil(n / T) windows; none for an empty document
    predicted = []
    for k, (x, y, valid) in enumerate(ws):
        assert x.shape == y.shape == (T,) and x.dtype == y.dtype == np.int32
        start = k * T  # window k predicts document tokens [kT, kT + valid)
        assert valid == min(T, n - start) and valid >= 1
        assert x[:valid].tolist() == seq[start : start + valid]  # from [EOS] + tokens, never another document
        assert y[:valid].tolist() == seq[start + 1 : start + valid + 1]  # the next token of each input
        assert (x[valid:] == EOS).all() and (y[valid:] == EOS).all()  # padding, not scored
        predicted += y[:valid].tolist()
    assert predicted == ids.tolist()  # every token exactly once, in order


def test_the_first_token_is_predicted_from_eos_alone() -> None:
    (x, y, valid), = dd.windows(np.asarray([5, 6], np.int32), EOS, T)
    assert (x[0], y[0], valid) == (EOS, 5, 2)


def fake_nll(seen: list[tuple[bytes, bytes]]):
    """A deterministic float32 'NLL' per position (a hash of the row and position) that logs its batches."""
    def fn(params: object, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        seen.append((xs.tobytes(), ys.tobytes()))
        out = np.empty(xs.shape, np.float32)
        for i in range(xs.shape[0]):
            h = hashlib.sha256(xs[i].tobytes() + ys[i].tobytes()).digest()
            out[i] = np.frombuffer(h, np.uint8)[: xs.shape[1]].astype(np.float32) / 37.0 + 0.1
        return out
    return fn


def reference_score(nll_fn, docs, eos_id: int, seq_len: int, batch_size: int) -> dict[str, ev.Tally]:
    """Every window of every document first, then fixed batches (the pre-streaming algorithm)."""
    rows = [(d, x, y, n) for d, (ids, _, _) in enumerate(docs) for x, y, n in dd.windows(ids, eos_id, seq_len)]
    per_doc = np.zeros(len(docs), dtype=np.float64)
    for b in range(0, len(rows), batch_size):
        chunk = rows[b : b + batch_size]
        pad = batch_size - len(chunk)
        xs = np.stack([r[1] for r in chunk] + [chunk[0][1]] * pad)
        ys = np.stack([r[2] for r in chunk] + [chunk[0][2]] * pad)
        nll = np.asarray(nll_fn(None, xs, ys), dtype=np.float64)
        for k, (d, _, _, n) in enumerate(chunk):
            per_doc[d] += nll[k, :n].sum()
    tallies: dict[str, ev.Tally] = defaultdict(ev.Tally)
    for d, (ids, corpus, n_bytes) in enumerate(docs):
        for key in ("", corpus):
            tallies[key].add(float(per_doc[d]), len(ids), n_bytes)
    return dict(tallies)


def hexed(tallies: dict[str, ev.Tally]) -> dict[str, tuple]:
    return {k: (t.nll_nats.hex(), t.tokens, t.bytes, t.docs, t.bits_per_byte.hex()) for k, t in tallies.items()}


def make_docs(seed: int, n: int) -> list[tuple[np.ndarray, str, int]]:
    rng = random.Random(seed)
    lengths = [0, 1, T - 1, T, T + 1, 3 * T + 5] + [rng.randrange(0, 5 * T) for _ in range(n)]
    rng.shuffle(lengths)
    return [(np.asarray([rng.randrange(1, 300) for _ in range(m)], np.int32), rng.choice("abc"), 2 * m + 1)
            for m in lengths]


@pytest.mark.parametrize("batch_size", [1, 3, 7, 64])
def test_streamed_scoring_equals_scoring_all_windows_at_once(batch_size: int) -> None:
    docs = make_docs(batch_size, 40)
    seen_ref: list = []
    seen: list = []
    want = reference_score(fake_nll(seen_ref), docs, EOS, T, batch_size)
    got = ev.score(fake_nll(seen), None, iter(docs), EOS, T, batch_size)
    assert seen == seen_ref  # the same batches, in the same order, padded the same way
    assert hexed(got) == hexed(want) and list(got) == list(want)
    assert got[""].docs == len(docs) and got[""].tokens == sum(len(d[0]) for d in docs)


def test_scoring_no_documents_gives_no_tallies() -> None:
    assert ev.score(fake_nll([]), None, iter([]), EOS, T, 4) == {}


def reference_unigram(train_ids: list[np.ndarray], vocab_size: int, docs) -> dict[str, ev.Tally]:
    """Float64 counts from per-document bincounts (the pre-streaming algorithm)."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for ids in train_ids:
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    logp = np.log(counts / counts.sum())
    tallies: dict[str, ev.Tally] = defaultdict(ev.Tally)
    for ids, corpus, n_bytes in docs:
        nll = float(-logp[ids].sum())
        for key in ("", corpus):
            tallies[key].add(nll, len(ids), n_bytes)
    return dict(tallies)


def test_streamed_unigram_equals_per_document_float_counts() -> None:
    train = [d[0] for d in make_docs(1, 300)] + [np.asarray([299, 299, 5, 400], np.int32)]  # 400 >= vocab: ignored
    val = make_docs(2, 50)
    rng = np.random.default_rng(0)
    chunks = np.split(np.concatenate(train), sorted(rng.integers(0, sum(map(len, train)), 9)))  # other cuts
    counts = ev.token_counts(chunks, 300)
    assert counts.dtype == np.int64 and counts.sum() == sum(len(x) for x in train) - 1
    assert hexed(ev.unigram(counts, val)) == hexed(reference_unigram(train, 300, val))


def write_shards(d: Path, docs: list[tuple[np.ndarray, str, int]], per_shard: int) -> list[Path]:
    d.mkdir(parents=True)
    paths = []
    for i in range(0, len(docs), per_shard):
        part = docs[i : i + per_shard]
        paths.append(d / f"validation-{len(paths):05d}.parquet")
        table = pa.table({"doc_id": [f"d{i + j}" for j in range(len(part))], "corpus": [c for _, c, _ in part],
                          "n_bytes": pa.array([n for *_, n in part], pa.int64()),
                          "tokens": pa.array([x.tolist() for x, _, _ in part], pa.list_(pa.uint16()))})
        pq.write_table(table, paths[-1], row_group_size=4)
    return paths


def test_documents_and_tokens_stream_from_the_shards_in_order(tmp_path: Path) -> None:
    docs = make_docs(3, 30)
    shards = write_shards(tmp_path / "tokens", docs, per_shard=9)
    got = list(dd.documents(shards, batch_rows=3))
    assert [(x.tolist(), c, n) for x, c, n in got] == [(x.tolist(), c, n) for x, c, n in docs]
    assert all(x.dtype == np.int32 for x, _, _ in got)
    flat = np.concatenate(list(dd.shard_tokens(shards, batch_rows=5)))
    assert flat.tolist() == np.concatenate([x for x, _, _ in docs]).tolist()
