"""The data stages on the small local corpus: fetch, curate, tokenize."""

import json
import shutil
import tarfile

import pyarrow.parquet as pq
from tokenizers import Tokenizer

from marin import hashing
from marin.data.curate import STEPS
from tests.servers import Http, file_answer


def _outputs(proj, stage: str) -> dict[str, str]:
    run = proj.runs(stage)[-1]
    return {r["body"]["name"]: r["body"]["digest"] for r in run if r["kind"] == "output"}


def test_fetch_digest_mismatch_stops_and_keeps_earlier_outputs(data_project) -> None:
    proj = data_project
    raw_before = proj.tree("data/raw")
    params = proj.params
    params["fetch"]["sources"][0]["sha256"] = "0" * 64
    proj.write_params(params)

    r = proj.stage("fetch", check=False)

    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "fetch.sources[mini]: sha256 mismatch" in err[0]
    assert "update the pinned sha256 in params.yaml" in err[0]
    assert proj.tree("data/raw") == raw_before
    failed = proj.runs("fetch")[-1]
    assert failed[-1]["body"]["status"] == "failed" and "sha256 mismatch" in failed[-1]["body"]["error"]
    assert proj.marin("ledger", "check").returncode == 0  # the ledger stays valid


def test_fetch_url_source(project, corpus, tmp_path) -> None:
    archive = tmp_path / "mini.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(corpus, arcname="mini")
    params = project.params
    src = params["fetch"]["sources"][0]
    with Http(file_answer(archive.read_bytes())) as server:
        url = f"{server.url}/mini.tar.gz"
        src.update(kind="url", locator=url, sha256=hashing.file_digest(archive)[7:])
        for ex in src["extract"]:
            ex["include"] = [f"mini/{p}" for p in ex["include"]]
        project.write_params(params)
        project.stage("fetch")
    project.stage("curate")
    inputs = [r["body"] for r in project.runs("fetch")[-1] if r["kind"] == "input"]
    assert inputs[0]["locator"] == f"url:{url}" and inputs[0]["license"] == "CC0-1.0"
    assert inputs[0]["digest"] == hashing.file_digest(archive)


def test_curation_funnel(data_project) -> None:
    m = json.loads((data_project.root / "data/curated/manifest.json").read_text())
    removed = {(r["step"], r["name"].rsplit("/", 1)[-1]) for r in m["removed"]}
    assert ("exact_dedup", "copy_of_doc03.txt") in removed or ("exact_dedup", "doc03.txt") in removed
    assert ("near_dedup", "near_doc05.txt") in removed
    assert ("min_words", "short.txt") in removed
    prose = m["funnel"]["corpora"]["prose"]
    assert prose["in"]["docs"] == 15
    assert prose["removed"]["exact_dedup"]["docs"] == 1 and prose["removed"]["near_dedup"]["docs"] == 1
    for c in m["funnel"]["corpora"].values():  # the funnel adds up, docs and bytes
        assert c["kept"]["docs"] == c["train"]["docs"] + c["validation"]["docs"] == c["kept_raw"]["docs"]
        assert c["kept"]["bytes"] == c["train"]["bytes"] + c["validation"]["bytes"]
        for k in ("docs", "bytes"):
            assert c["in"][k] == c["kept_raw"][k] + sum(v[k] for v in c["removed"].values())
    assert prose["kept_raw"]["bytes"] > prose["kept"]["bytes"]  # the fixtures' texts end in newlines: stripped
    assert [s["step"] for s in m["funnel"]["steps"]] == list(STEPS)
    # Independent check against the Parquet files themselves.
    tables = {s: pq.read_table(data_project.root / f"data/curated/{s}.parquet") for s in ("train", "validation")}
    assert sum(t.num_rows for t in tables.values()) == sum(c["kept"]["docs"] for c in m["funnel"]["corpora"].values())
    verses = [n for t in tables.values() for n, c in zip(t["name"].to_pylist(), t["corpus"].to_pylist(), strict=True)
              if c == "verses"]
    assert sorted(v.split("#")[1] for v in verses) == [f"{b} {c}" for b in ("Alpha", "Beta") for c in (1, 2, 3)]
    stored = {c: 0 for c in m["funnel"]["corpora"]}  # kept bytes are the stored texts' UTF-8 bytes
    for t in tables.values():
        for c, text in zip(t["corpus"].to_pylist(), t["text"].to_pylist(), strict=True):
            stored[c] += len(text.encode())
    assert stored == {c: v["kept"]["bytes"] for c, v in m["funnel"]["corpora"].items()}
    for t in tables.values():  # doc_id is the sha256 of the stored (normalized) text
        for doc_id, text in zip(t["doc_id"].to_pylist(), t["text"].to_pylist(), strict=True):
            assert doc_id == hashing.bytes_digest(text.encode())


def test_tokens_roundtrip_to_text(data_project) -> None:
    root = data_project.root
    tok = Tokenizer.from_file(str(root / "data/tokens/tokenizer.json"))
    assert tok.get_vocab_size() == 400
    train = pq.read_table(root / "data/curated/train.parquet")
    texts = dict(zip(train["doc_id"].to_pylist(), train["text"].to_pylist(), strict=True))
    m = json.loads((root / "data/tokens/manifest.json").read_text())
    n = 0
    for shard in m["splits"]["train"]["shards"]:
        t = pq.read_table(root / "data/tokens" / shard["file"])
        assert hashing.file_digest(root / "data/tokens" / shard["file"]) == shard["digest"]
        for doc_id, ids in zip(t["doc_id"].to_pylist(), t["tokens"].to_pylist(), strict=True):
            assert tok.decode(ids) == texts[doc_id]  # byte-level BPE is lossless
            n += len(ids)
    assert n == m["splits"]["train"]["tokens"]
    assert m["tokenizer"]["digest"] == hashing.file_digest(root / "data/tokens/tokenizer.json")


def test_rerun_is_bit_identical_with_equal_recipe(data_project) -> None:
    before = {s: _outputs(data_project, s) for s in ("curate", "tokenize")}
    shutil.rmtree(data_project.root / "data" / "tokens")
    for s in ("curate", "tokenize"):
        data_project.stage(s)
        runs = data_project.runs(s)
        assert len(runs) == 2 and runs[0][0]["body"]["recipe_digest"] == runs[1][0]["body"]["recipe_digest"]
        assert _outputs(data_project, s) == before[s]


def test_missing_input_is_a_clear_error(project) -> None:
    r = project.stage("tokenize", check=False)
    assert r.returncode == 1
    assert "data/curated/train.parquet does not exist; run the stage that makes it" in r.stderr
    assert project.ledger_files() == {}
