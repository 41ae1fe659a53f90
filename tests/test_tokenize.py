"""marin.data.tokenize in process: the fast encode path, shard cutting, the training sample,
the pinned pretrained tokenizer (no stage runs here; tests/test_tokenize_scale.py runs them)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from marin import config, hashing
from marin.config import PretrainedTokenizer, TokenizeParams
from marin.data import chat, parquet
from marin.data import tokenize as tk
from marin.errors import ParamsError, StageError
from marin.paths import SCHEMA_DIR
from tests.conftest import REPO, make_text

P = TokenizeParams(vocab_size=400, min_frequency=2, shard_max_tokens=5000)
EDGE_TEXTS = ["", " ", "  two leading spaces", "tabs\t\tand\nnew\n\n\nlines  ", "emoji 🙂 and café, naïve",
              "ROMEO. Wherefore art thou?", "x" * 3000, "数字 123 4567 <|endoftext|> literal"]


def _docs(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [make_text(rng, rng.randint(1, 30)) for _ in range(n)]


def _curated(path: Path, texts: list[str]) -> Path:
    """A file shaped like data/curated/<split>.parquet."""
    parquet.write(pa.table({
        "doc_id": [hashing.bytes_digest(t.encode()) for t in texts],
        "corpus": ["a" if i % 3 else "b" for i in range(len(texts))],
        "source": ["s"] * len(texts), "name": [f"d{i}" for i in range(len(texts))], "license": ["CC0-1.0"] * len(texts),
        "n_bytes": pa.array([len(t.encode()) for t in texts], pa.int64()),
        "text": texts,
    }), path)
    return path


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tk.train_tokenizer(_docs(60), P)


def test_encode_batch_fast_gives_the_ids_of_encode_batch(tok: Tokenizer) -> None:
    texts = _docs(40, seed=9) + EDGE_TEXTS
    plain = tk.plain(Tokenizer.from_str(tok.to_str()))  # as the workers encode: <|endoftext|> as text
    slow = [e.ids for e in plain.encode_batch(texts)]
    assert [e.ids for e in plain.encode_batch_fast(texts)] == slow
    lengths, ids, carrying = tk.encode_task(tk.EncodeTask(tok.to_str(), texts))
    assert carrying == 1 and tok.token_to_id(tk.EOS) not in ids.tolist()  # the one literal, never the id
    assert ids.dtype == np.uint16 and lengths.tolist() == [len(x) for x in slow]
    assert ids.tolist() == [i for x in slow for i in x]


def _greedy(lengths: list[int], max_tokens: int) -> list[int]:
    """Docs per shard as the in-memory stage cut them: a new shard when the next doc would pass the limit."""
    out, docs, total = [], 0, 0
    for n in lengths:
        if docs and total + n > max_tokens:
            out.append(docs)
            docs, total = 0, 0
        docs, total = docs + 1, total + n
    return [*out, docs] if docs else out


def _in_memory_shards(out: Path, meta: pa.Table, ids: list[np.ndarray], per_shard: list[int]) -> None:
    """Shards exactly as the in-memory stage wrote them (a list of lists for the tokens)."""
    a = 0
    for i, k in enumerate(per_shard):
        parquet.write(pa.table({
            "doc_id": meta["doc_id"].slice(a, k), "corpus": meta["corpus"].slice(a, k),
            "n_bytes": meta["n_bytes"].slice(a, k),
            "tokens": pa.array([x.tolist() for x in ids[a:a + k]], pa.list_(pa.uint16())),
        }), out / tk.shard_name("train", i, len(per_shard)))
        a += k


@pytest.mark.parametrize("max_tokens", [1, 40, 300, 10**9])
@pytest.mark.parametrize("batching", ["one", "each", "random"])
def test_shards_are_cut_like_the_in_memory_stage_whatever_the_batches(tmp_path: Path, max_tokens: int,
                                                                       batching: str) -> None:
    rng = np.random.default_rng(max_tokens)
    lengths = rng.integers(0, 120, 200)
    lengths[[5, 6, 50]] = [0, 500, 0]  # empty documents and one over the limit
    ids = [rng.integers(0, 65536, n).astype(np.uint16) for n in lengths]
    meta = pa.table({"doc_id": [f"id{i}" for i in range(200)], "corpus": ["c"] * 200,
                     "n_bytes": pa.array(lengths * 3, pa.int64())})
    cuts = {"one": [0, 200], "each": list(range(201)), "random": [0, *sorted(rng.choice(199, 30, False) + 1), 200]}
    writer = tk.ShardWriter(tmp_path, "train", max_tokens)
    for a, b in zip(cuts[batching][:-1], cuts[batching][1:], strict=True):
        writer.add(meta.slice(a, b - a), lengths[a:b], np.concatenate(ids[a:b]))
    shards = writer.close()
    per_shard = _greedy(lengths.tolist(), max_tokens)
    assert [s["docs"] for s in shards] == per_shard
    assert sorted(p.name for p in tmp_path.iterdir()) == [s["file"] for s in shards]  # no .partial left
    ref = tmp_path / "ref"
    ref.mkdir()
    _in_memory_shards(ref, meta, ids, per_shard)
    for s in shards:
        assert (tmp_path / s["file"]).read_bytes() == (ref / s["file"]).read_bytes(), s["file"]
        assert s["digest"] == hashing.file_digest(ref / s["file"])


def test_the_sample_is_the_whole_split_in_file_order_when_it_fits(tmp_path: Path) -> None:
    texts = _docs(300)
    path = _curated(tmp_path / "train.parquet", texts)
    total = sum(len(t.encode()) for t in texts)
    assert tk.split_bytes(path) == total
    sample = tk.Sample(path, total)
    assert list(sample) == texts and (sample.docs, sample.bytes) == (300, total)


def test_the_sample_is_bounded_keyed_and_pure(tmp_path: Path) -> None:
    texts = _docs(600)
    path = _curated(tmp_path / "train.parquet", texts)
    budget = tk.split_bytes(path) // 4
    first = tk.Sample(path, budget)
    chosen = list(first)
    assert 0 < first.bytes <= budget and first.docs == len(chosen)
    assert chosen == [t for t in texts if t in set(chosen)]  # file order
    assert list(tk.Sample(path, budget)) == chosen  # the same sample twice
    assert list(tk.Sample(_curated(tmp_path / "copy.parquet", list(texts)), budget)) == chosen  # a function of the data
    assert list(tk.Sample(path, budget // 2)) != chosen


def test_the_keyed_draw_has_the_asked_probability() -> None:
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20000)]
    assert all(tk.sampled(i, 10, 10) for i in ids[:100])  # budget == total: every document
    share = sum(tk.sampled(i, 1, 4) for i in ids) / len(ids)
    assert 0.24 < share < 0.26


def test_a_tiny_sample_trains_another_tokenizer_the_same_one_twice(tmp_path: Path) -> None:
    path = _curated(tmp_path / "train.parquet", _docs(300))
    full = tk.train_tokenizer(tk.Sample(path, 1 << 40), P).to_str()
    tiny = tk.train_tokenizer(tk.Sample(path, 2000), P).to_str()
    assert tiny != full
    assert tk.train_tokenizer(tk.Sample(path, 2000), P).to_str() == tiny
    assert tk.train_tokenizer(tk.Sample(path, 1 << 40), P).to_str() == full


# -- the pinned pretrained tokenizer ----------------------------------------------------------

def _pin(root: Path, rel: str, data: bytes, **kw: str) -> PretrainedTokenizer:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return PretrainedTokenizer(path=rel, sha256=hashlib.sha256(data).hexdigest(), **kw)


def test_a_pinned_tokenizer_is_read_checked_and_described(tmp_path: Path, tok: Tokenizer) -> None:
    data = tok.to_str(pretty=True).encode()
    pinned = tk.pretrained(tmp_path, _pin(tmp_path, "tokenizers/t.json", data))
    assert (pinned.path, pinned.data, pinned.digest) == ("tokenizers/t.json", data, hashing.bytes_digest(data))
    assert tk.describe(pinned.tokenizer, pinned.eos) == {
        "type": "byte-level BPE", "vocab_size": 400, "special_tokens": [tk.EOS, *chat.CHAT_TOKENS],
        "eos_id": tok.token_to_id(tk.EOS), "library": "tokenizers"}
    absolute = dataclasses.replace(_pin(tmp_path, "t2.json", data), path=str(tmp_path / "t2.json"))
    assert tk.pretrained(tmp_path, absolute).path == "t2.json"  # absolute, but inside: recorded relative


def test_a_pinned_tokenizer_saved_with_truncation_and_padding_encodes_whole_documents(tmp_path: Path,
                                                                                    tok: Tokenizer) -> None:
    saved = Tokenizer.from_str(tok.to_str())
    saved.enable_truncation(max_length=4)
    saved.enable_padding(length=64)
    pinned = tk.pretrained(tmp_path, _pin(tmp_path, "t.json", saved.to_str().encode()))
    texts = _docs(5, seed=11)
    lengths, ids, _ = tk.encode_task(tk.EncodeTask(pinned.tokenizer.to_str(), texts))
    assert lengths.tolist() == [len(tok.encode(t).ids) for t in texts] and all(n > 64 for n in lengths)
    assert ids.tolist() == [i for t in texts for i in tok.encode(t).ids]
    loaded = tk.load(tmp_path / "t.json")  # as evaluate loads data/tokens/tokenizer.json
    assert loaded.truncation is None and loaded.padding is None and saved.truncation is not None


def _wordlevel(n: int) -> bytes:
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return t.to_str().encode()


@pytest.mark.parametrize("case, error, words", [
    ("digest", StageError, "tokenize.pretrained.sha256: tokenizers/t.json hashes to sha256:"),
    ("missing", StageError, "tokenize.pretrained.path: tokenizers/none.json is not a file"),
    ("outside", ParamsError, "lies outside the project"),
    ("dotdot", ParamsError, "tokenize.pretrained.path: ../t.json lies outside the project"),
    ("symlink_out", ParamsError, "tokenize.pretrained.path: tokenizers/link.json lies outside the project"),
    ("not_json", StageError, "is not a tokenizers JSON file"),
    ("too_many_ids", StageError, "has 70000 tokens; token shards hold uint16 ids, so at most 65536"),
    ("no_eos", StageError, "tokenize.pretrained.eos: '<|endoftext|>' is not a token of tokenizers/t.json"),
])
def test_a_pretrained_tokenizer_is_refused(tmp_path: Path, tok: Tokenizer, case: str, error: type,
                                           words: str) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    good = tok.to_str().encode()
    p = _pin(root, "tokenizers/t.json", good)
    outside = _pin(tmp_path, "t.json", good)
    if case == "digest":
        (root / p.path).write_bytes(good.replace(b'"<|endoftext|>"', b'"<|endoftext|>"  ', 1))
    elif case == "missing":
        p = dataclasses.replace(p, path="tokenizers/none.json")
    elif case == "outside":
        p = dataclasses.replace(outside, path=str(tmp_path / "t.json"))
    elif case == "dotdot":
        p = dataclasses.replace(outside, path="../t.json")
    elif case == "symlink_out":
        (root / "tokenizers/link.json").symlink_to(tmp_path / "t.json")
        p = dataclasses.replace(outside, path="tokenizers/link.json")
    elif case == "not_json":
        p = _pin(root, "tokenizers/t.json", b"{not json")
    elif case == "too_many_ids":
        p = _pin(root, "tokenizers/t.json", _wordlevel(70000), eos="w1")
    elif case == "no_eos":
        p = _pin(root, "tokenizers/t.json", _wordlevel(300))
    with pytest.raises(error) as e:
        tk.pretrained(root, p)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("rel, ok", [("tokenizer/t.json", True), ("tokenizer/gpt2/tokenizer.json", True),
                                     ("t.json", False), ("tokenizers/t.json", False), ("tokenizer", False),
                                     ("data/tokenizer/t.json", False)])
def test_a_pretrained_tokenizer_lies_in_the_folder_dvc_tracks(rel: str, ok: bool) -> None:
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["tokenize"]["deps"]
    assert tk.PRETRAINED_DIR in deps  # so DVC reruns tokenize when a file there changes
    if ok:
        assert tk.tracked(rel) == rel
        return
    with pytest.raises(ParamsError, match=f"tokenize.pretrained.path: {rel} is not in tokenizer/") as e:
        tk.tracked(rel)
    assert "\n" not in str(e.value)


# -- params -----------------------------------------------------------------------------------

def test_the_sample_default_is_one_value_and_above_the_shipped_train_split() -> None:
    schema = json.loads((SCHEMA_DIR / "params.schema.json").read_text())
    default = schema["properties"]["tokenize"]["properties"]["train_sample_bytes"]["default"]
    assert default == TokenizeParams.train_sample_bytes == config.load(REPO / "params.yaml").tokenize.train_sample_bytes
    assert default > 9_325_145  # the shipped corpus's train split: its tokenizer stays the full-split one


def _params(**tokenize: object) -> dict:
    import yaml

    data = yaml.safe_load((REPO / "params.yaml").read_text())
    data["tokenize"].update(tokenize)
    return data


def test_pretrained_params_parse_and_are_checked() -> None:
    p = config.parse(_params(pretrained={"path": "t.json", "sha256": "a" * 64}))
    assert p.tokenize.pretrained == PretrainedTokenizer("t.json", "a" * 64, tk.EOS)
    with pytest.raises(ParamsError, match=r"tokenize\.pretrained\.sha256"):
        config.parse(_params(pretrained={"path": "t.json", "sha256": "sha256:" + "a" * 64}))
    with pytest.raises(ParamsError, match=r"tokenize\.train_sample_bytes"):
        config.parse(_params(train_sample_bytes=0))


def test_shard_files_read_back_as_written(tmp_path: Path, tok: Tokenizer) -> None:
    texts = _docs(30)
    path = _curated(tmp_path / "train.parquet", texts)
    from marin.data.engine import Engine

    writer = tk.ShardWriter(tmp_path, "train", 2000)
    for meta, lengths, ids, _ in tk.encoded(path, tok.to_str(), Engine()):
        writer.add(meta, lengths, ids)
    rows = [r for s in writer.close() for r in pq.read_table(tmp_path / s["file"]).to_pylist()]
    assert [tok.decode(r["tokens"]) for r in rows] == texts
    assert [r["doc_id"] for r in rows] == [hashing.bytes_digest(t.encode()) for t in texts]
