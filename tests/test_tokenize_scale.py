"""The tokenize stage at corpus scale (issue 12): streamed, bounded, parallel, and the same
bytes as the in-memory stage; a bounded training sample; a pinned pretrained tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from marin import hashing
from marin.config import TokenizeParams
from marin.data import parquet
from marin.data import tokenize as tk
from tests.conftest import BIN, Project
from tests.ray_cluster import ray_head

# The stage with one document per engine task, so that 2 and 4 workers really run tasks
# out of order (the mini corpus is one default-sized batch).
SMALL_TASKS = ("import sys; import marin.data.tokenize as tk; tk.ENCODE_BATCH_BYTES = 1; tk.READ_ROWS = 1; "
               "from marin.stages.runner import stage_main; stage_main('tokenize')")


def _small_tasks(proj: Project, check: bool = True):
    return proj.run(str(BIN / "python"), "-c", SMALL_TASKS, check=check)


def _set(proj: Project, section: str, **values: object) -> None:
    params = proj.params
    params[section].update(values)
    proj.write_params(params)


def _in_memory(root: Path, out: Path) -> None:
    """The stage as it was before streaming: both splits read whole, the tokenizer trained on
    the whole train split, ``encode_batch``, shards cut from the full list (the reference)."""
    p = TokenizeParams(vocab_size=400, min_frequency=2, shard_max_tokens=5000)
    tables = {s: pq.read_table(root / f"data/curated/{s}.parquet") for s in ("train", "validation")}
    tok = tk.train_tokenizer(tables["train"]["text"].to_pylist(), p)
    (out / "tokenizer.json").write_bytes(tok.to_str(pretty=True).encode())
    for split, table in tables.items():
        ids = [np.asarray(e.ids, dtype=np.uint16) for e in tok.encode_batch(table["text"].to_pylist())]
        ranges, start, total = [], 0, 0
        for i, x in enumerate(ids):
            if i > start and total + len(x) > p.shard_max_tokens:
                ranges.append((start, i))
                start, total = i, 0
            total += len(x)
        ranges.append((start, len(ids)))
        for i, (a, b) in enumerate(ranges):
            parquet.write(pa.table({
                "doc_id": table["doc_id"].slice(a, b - a), "corpus": table["corpus"].slice(a, b - a),
                "n_bytes": table["n_bytes"].slice(a, b - a),
                "tokens": pa.array([x.tolist() for x in ids[a:b]], pa.list_(pa.uint16())),
            }), out / tk.shard_name(split, i, len(ranges)))


def test_streamed_outputs_are_the_in_memory_stage_bytes(data_project: Project, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    _in_memory(data_project.root, ref)
    tokens = data_project.tree("data/tokens")
    from marin.data import chat

    assert tokens.pop(chat.TEMPLATE_FILE) == chat.TEMPLATE.encode()  # the chat template, beside the tokenizer
    assert {k: v for k, v in tokens.items() if k != "manifest.json"} == {p.name: p.read_bytes() for p in ref.iterdir()}
    m = json.loads(tokens["manifest.json"])
    assert sum(s["tokens"] for s in m["splits"]["train"]["shards"]) == m["splits"]["train"]["tokens"]
    assert sum(c["docs"] for c in m["splits"]["train"]["corpora"].values()) == m["splits"]["train"]["docs"]
    assert "train_sample_bytes" not in m["params"]  # the default is not written: the manifest is unchanged too


def test_outputs_are_identical_for_1_2_and_4_workers(data_project: Project) -> None:
    expected = data_project.tree("data/tokens")  # engine local, 1 worker, default batches (the fixture's run)
    assert data_project.runs("tokenize")[-1][0]["body"]["execution"] == {"engine": "local", "workers": 1}
    for workers in (2, 4):
        _set(data_project, "runtime", data={"engine": "local", "workers": workers})
        _small_tasks(data_project)
        assert data_project.tree("data/tokens") == expected, f"{workers} workers"
        started = data_project.runs("tokenize")[-1][0]["body"]
        assert started["execution"] == {"engine": "local", "workers": workers}
        assert "runtime" not in started["params"]  # where it ran is not part of the recipe
    two, four = data_project.runs("tokenize")[-2:]  # the same command (the fixture's is `-m`): the same recipe
    assert two[0]["body"]["recipe_digest"] == four[0]["body"]["recipe_digest"]


@pytest.mark.slow
def test_ray_cluster_gives_the_same_bytes(data_project: Project) -> None:
    expected = data_project.tree("data/tokens")
    with ray_head(data_project.root) as env:
        _set(data_project, "runtime", data={"engine": "ray", "workers": 2})
        data_project.env.update(env)
        _small_tasks(data_project)
        assert data_project.tree("data/tokens") == expected
        started = data_project.runs("tokenize")[-1][0]["body"]
        assert started["execution"] == {"engine": "ray", "workers": 2, "ray_address": env["RAY_ADDRESS"]}


def test_a_tiny_sample_trains_another_tokenizer_and_the_same_one_again(data_project: Project) -> None:
    root = data_project.root
    full = (root / "data/tokens/tokenizer.json").read_bytes()
    _set(data_project, "tokenize", train_sample_bytes=3000)
    data_project.stage("tokenize")
    tiny = (root / "data/tokens/tokenizer.json").read_bytes()
    assert tiny != full
    sample = tk.Sample(root / "data/curated/train.parquet", 3000)
    again = tk.train_tokenizer(sample, TokenizeParams(vocab_size=400, min_frequency=2, shard_max_tokens=5000))
    assert again.to_str(pretty=True).encode() == tiny and 0 < sample.bytes <= 3000
    m = json.loads((root / "data/tokens/manifest.json").read_text())
    assert m["params"]["train_sample_bytes"] == 3000 and m["tokenizer"]["digest"] == hashing.bytes_digest(tiny)


def _pretrained_file(proj: Project) -> tuple[str, bytes]:
    """Another tokenizer (trained on the validation split, vocab 300), saved in the project."""
    texts = pq.read_table(proj.root / "data/curated/validation.parquet")["text"].to_pylist()
    tok = tk.train_tokenizer(texts, TokenizeParams(vocab_size=300, min_frequency=1, shard_max_tokens=5000))
    (proj.root / "tokenizer").mkdir(exist_ok=True)  # the project's (dvc.yaml: a tokenize dependency)
    data = tok.to_str().encode()
    (proj.root / "tokenizer/pre.json").write_bytes(data)
    return "tokenizer/pre.json", data


def test_a_pinned_pretrained_tokenizer_is_used_recorded_and_its_pin_checked(data_project: Project) -> None:
    root = data_project.root
    rel, data = _pretrained_file(data_project)
    sha = hashlib.sha256(data).hexdigest()
    _set(data_project, "tokenize", pretrained={"path": rel, "sha256": sha})
    data_project.stage("tokenize")
    assert (root / "data/tokens/tokenizer.json").read_bytes() == data  # its own bytes, not re-serialized
    m = json.loads((root / "data/tokens/manifest.json").read_text())
    assert m["tokenizer"]["pretrained"] == {"path": rel, "digest": f"sha256:{sha}", "added_tokens": []}
    assert m["tokenizer"]["vocab_size"] == 300 and m["inputs"]["pretrained_tokenizer"] == f"sha256:{sha}"
    run = data_project.runs("tokenize")[-1]
    inputs = {r["body"]["name"]: r["body"] for r in run if r["kind"] == "input"}
    assert inputs["pretrained_tokenizer"]["path"] == rel and inputs["pretrained_tokenizer"]["digest"] == f"sha256:{sha}"
    tok = Tokenizer.from_str(data.decode())
    texts = pq.read_table(root / "data/curated/train.parquet")["text"].to_pylist()
    shard = pq.read_table(root / "data/tokens" / m["splits"]["train"]["shards"][0]["file"])
    assert [tok.decode(x) for x in shard["tokens"].to_pylist()] == texts[:shard.num_rows]

    (root / rel).write_bytes(data + b" ")  # the same tokenizer, other bytes: refused before any run
    ledger, tokens = data_project.ledger_files(), data_project.tree("data/tokens")
    r = data_project.stage("tokenize", check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"tokenize.pretrained.sha256: {rel} hashes to sha256:{hashlib.sha256(data + b' ').hexdigest()}" in r.stderr
    assert data_project.ledger_files() == ledger and data_project.tree("data/tokens") == tokens
