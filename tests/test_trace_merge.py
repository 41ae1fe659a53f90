"""The merge of shard suffix arrays (marin/evaluate/sa_merge.py) against the one-shot suffix array of the
whole token file: random tokens cut into shards of various sizes, one shard, empty shards, identical
documents across shards, long shared runs, and blocks from one suffix to all of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marin.evaluate import sa_merge, sarray, trace_index


def _merged(tmp: Path, shards: list[list[np.ndarray]], block: int) -> tuple[np.ndarray, np.ndarray]:
    """Shards of documents appended and merged as the index builds them; (merged array, token file)."""
    work = tmp / "work"
    work.mkdir(parents=True)
    for name in (tmp / sarray.TOKENS_FILE, work / "sa.i32", work / "keys.u64"):
        name.touch()
    sizes = []
    for docs in shards:
        t = np.concatenate([np.append(d, sarray.SEP) for d in docs]) if docs else np.zeros(0, dtype=np.int64)
        sizes.append(sarray.append_shard(tmp, work, t) if len(t) else 0)
    sa_merge.merge(tmp / sarray.TOKENS_FILE, work, sizes, tmp / "sa", block)
    tokens = np.fromfile(tmp / sarray.TOKENS_FILE, dtype=sarray.TOKENS_DTYPE)
    return np.fromfile(tmp / "sa", dtype=sarray.sa_dtype(len(tokens))), tokens


def _docs(rng: np.random.Generator, n: int, vocab: int, longest: int) -> list[np.ndarray]:
    return [rng.integers(0, vocab, rng.integers(0, longest + 1)) for _ in range(n)]


CASES = {  # name: (shards of (documents, vocabulary, longest document), block)
    "one shard": ([(6, 3, 20)], 7),
    "two shards": ([(5, 2, 15), (5, 2, 15)], 4),
    "uneven shards": ([(1, 3, 40), (12, 3, 5), (3, 3, 30), (1, 3, 2)], 9),
    "empty shard between": ([(4, 2, 10), (0, 2, 0), (4, 2, 10)], 5),
    "many small shards": ([(2, 4, 6)] * 9, 3),
    "block of one suffix": ([(3, 2, 8), (3, 2, 8), (2, 2, 8)], 1),
    "block of everything": ([(4, 3, 12), (4, 3, 12)], 10_000),
    "one symbol": ([(3, 1, 25), (3, 1, 25), (2, 1, 25)], 6),
    "large vocabulary": ([(5, 60_000, 30), (5, 60_000, 30)], 8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_merged_shards_are_the_suffix_array_of_the_whole_file(tmp_path: Path, name: str) -> None:
    shapes, block = CASES[name]
    for seed in range(5):
        rng = np.random.default_rng([seed, len(name)])
        shards = [_docs(rng, *shape) for shape in shapes]
        got, tokens = _merged(tmp_path / str(seed), shards, block)
        assert len(got) == len(tokens) == sum(len(d) + 1 for s in shards for d in s)
        assert got.tolist() == sarray.suffix_array(tokens).tolist()


def test_identical_documents_across_shards_sort_by_position(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    doc = rng.integers(0, 2, 300)  # 300 tokens: ties run far past a key's 8 tokens
    shards = [[doc, rng.integers(0, 2, 50)], [doc], [rng.integers(0, 2, 40), doc, doc]]
    got, tokens = _merged(tmp_path, shards, 16)
    assert got.tolist() == sarray.suffix_array(tokens).tolist()
    starts = np.nonzero(np.concatenate([[True], tokens[:-1] == sarray.SEP]))[0]
    copies = [int(s) for s in starts if np.array_equal(tokens[s:s + 301], np.append(doc, sarray.SEP))]
    rank = {int(p): r for r, p in enumerate(got)}
    assert len(copies) == 4 and sorted(copies, key=rank.__getitem__) == copies  # equal suffixes: by position


def test_the_index_is_the_same_whatever_the_shard_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    docs = [trace_index.Doc(f"d{i}", "c", "s", "L", d) for i, d in enumerate(_docs(rng, 40, 6, 60))]
    for size in (30, 200, 100_000):
        trace_index.build(docs, tmp_path / str(size), size)
    files = ["tokens.u32", "sa.i32", "first.i64", "docs.jsonl", "unigram.u64"]
    assert sorted(p.name for p in (tmp_path / "30").iterdir()) == sorted([*files, "index.json"])  # work removed
    for f in files:
        assert (tmp_path / "30" / f).read_bytes() == (tmp_path / "200" / f).read_bytes() == (
            tmp_path / "100000" / f).read_bytes()


def test_document_boundaries_are_global(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    ids = _docs(rng, 30, 5, 40)
    trace_index.build((trace_index.Doc(f"d{i}", "c", "s", "L", d) for i, d in enumerate(ids)), tmp_path, 50)
    index = trace_index.Index(tmp_path)
    assert index.meta["shards"] > 5
    for k, d in enumerate(ids):
        for j in range(len(d)):
            row, at = index.locate(index.rows[k]["start"] + j)
            assert (row["id"], at) == (f"d{k}", j) and int(index.store.tokens[row["start"] + at]) == d[j]


def test_a_token_id_the_keys_cannot_hold_is_one_line(tmp_path: Path) -> None:
    doc = trace_index.Doc("big", "c", "s", "L", np.array([1, sarray.TOKEN_LIMIT]))
    with pytest.raises(trace_index.TraceError) as e:
        trace_index.build([doc], tmp_path, 100)
    assert len(str(e.value).splitlines()) == 1 and "'big'" in str(e.value) and str(sarray.TOKEN_LIMIT) in str(e.value)
