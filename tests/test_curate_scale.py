"""Curate at scale: shards by input, reduce in order. The same bytes (both Parquet files and
the manifest) whatever the shard size, the dedup spill thresholds, the engine (local with 1,
2 or 4 workers; a Ray cluster; a local Ray) — and the funnel the test corpus predicts."""

from __future__ import annotations

import hashlib
import itertools
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin import config
from marin.data import curate as cm
from marin.data import dedup, manifest, parquet
from marin.data import shards as sm
from marin.data.engine import Engine
from tests.conftest import REPO, Project, make_corpus, mini_params
from tests.ray_cluster import NO_UV_HOOK, ray_head

OUTPUTS = ("train.parquet", "validation.parquet", "manifest.json")


def run_curate(params: config.Params, archive: Path, dest: Path, engine: Engine | None = None) -> dict[str, bytes]:
    """Curate one source's archive in this process; the output files' bytes."""
    engine = engine or Engine()
    dest.mkdir(parents=True)
    work = dest / ".work"
    work.mkdir()
    c = cm.curate([(params.fetch.sources[0], archive)], params.curate, engine, dest, work)
    splits = c.close()
    manifest.write_streamed({"kind": "curate", "params": {}, "sources": [], "funnel": c.funnel.as_dict(),
                             "removed": [], "splits": splits}, c.removed, dest / "manifest.json")
    return {name: (dest / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> tuple[config.Params, Path]:
    d = tmp_path_factory.mktemp("scale") / "mini"
    make_corpus(d)
    return config.parse(mini_params(d)), d


@pytest.fixture(scope="module")
def reference(mini: tuple[config.Params, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    params, d = mini
    return run_curate(params, d, tmp_path_factory.mktemp("ref") / "out")


# -- sharding: cutting the input anywhere gives the same documents -----------------------

RAW = ("\ufeffline one\r\nline two\rline three\n\n" + "x" * 50 + "\r\n\r\nlast line without end").encode()


class _Bytes:
    """A stream that returns at most ``most`` bytes a read, as decompressors may."""

    def __init__(self, data: bytes, most: int = 1 << 30):
        self.data, self.most = data, most

    def read(self, n: int = -1) -> bytes:
        n = min(n, self.most) if n >= 0 else len(self.data)
        out, self.data = self.data[:n], self.data[n:]
        return out


def _lines(text: str, first: int = 1) -> dict[int, str]:
    """Line number -> line, numbered as the whole-member reader did (\r\n, \r, \n end a line)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return {first + i: ln for i, ln in enumerate(lines) if ln}


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 49, 1000])
def test_line_chunks_cut_only_at_line_ends(size: int) -> None:
    chunks = list(sm.line_chunks(_Bytes(RAW, most=5), size))
    assert b"".join(c for _, c in chunks) == RAW.removeprefix(b"\xef\xbb\xbf")
    for (_, chunk), (_, after) in itertools.pairwise(chunks):
        assert chunk.endswith((b"\n", b"\r")) and not (chunk.endswith(b"\r") and after.startswith(b"\n"))
    got: dict[int, str] = {}
    for first, chunk in chunks:
        got.update(_lines(chunk.decode(), first))
    assert got == _lines(RAW.decode("utf-8-sig"))


def test_line_numbers_are_the_whole_members(mini: tuple[config.Params, Path]) -> None:
    params, d = mini
    ex = params.fetch.sources[0].extract[1]
    data = (d / "verses.jsonl").read_bytes()
    ungrouped = type(ex)(**{**ex.__dict__, "group_by": ()})

    def names(size: int) -> list[tuple[str, str]]:
        shards = [sm.Shard("a", sm.Origin("verses", "mini", "CC0-1.0"), ungrouped, params.curate, 1, "verses.jsonl",
                           first, chunk) for first, chunk in sm.line_chunks(_Bytes(data), size)]
        return [(o.name, o.doc_id) for o in cm.stitched(map(cm.process_shard, shards), params.curate)]

    whole = names(len(data) + 1)
    assert whole[0][0] == "verses.jsonl#1" and len(whole) == 48
    for size in (1, 100, 333, 4096):
        assert names(size) == whole


@pytest.mark.parametrize("size", [1, 300, 1000, 1 << 22])
def test_groups_cut_by_shards_are_joined(mini: tuple[config.Params, Path], size: int) -> None:
    params, d = mini
    ex = params.fetch.sources[0].extract[1]
    data = (d / "verses.jsonl").read_bytes()
    shards = [sm.Shard("a", sm.Origin("verses", "mini", "CC0-1.0"), ex, params.curate, 1, "verses.jsonl", first,
                       chunk) for first, chunk in sm.line_chunks(_Bytes(data), size)]
    docs = list(cm.stitched(map(cm.process_shard, shards), params.curate))
    assert [o.name for o in docs] == [f"verses.jsonl#{b} {c}" for b in ("Alpha", "Beta") for c in (1, 2, 3)]
    assert all(o.group is not None and o.group[2] == 1 + 8 * i for i, o in enumerate(docs))  # first lines
    texts = [o.text.decode() for o in docs if o.text is not None]
    assert all(t.count("\n") == 7 for t in texts)  # eight verses per chapter, joined by newlines


def test_shard_size_and_spill_thresholds_change_no_byte(mini: tuple[config.Params, Path], reference: dict[str, bytes],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params, d = mini
    monkeypatch.setattr(sm, "SHARD_BYTES", 300)  # every text member its own shard, verses cut mid-chapter
    monkeypatch.setattr(dedup, "EXACT_SPILL_AT", 2)  # both indexes on SQLite almost from the start
    monkeypatch.setattr(dedup, "NEAR_SPILL_AT", 2)
    assert run_curate(params, d, tmp_path / "out") == reference


def test_row_groups_are_streamed(mini: tuple[config.Params, Path], reference: dict[str, bytes], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    params, d = mini
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 3)
    out = run_curate(params, d, tmp_path / "out")
    train = pq.ParquetFile(tmp_path / "out" / "train.parquet")
    assert train.metadata.num_row_groups == -(-train.metadata.num_rows // 3) > 1
    assert train.read().equals(pq.read_table(pa.BufferReader(reference["train.parquet"])))
    assert _no_digests(out["manifest.json"]) == _no_digests(reference["manifest.json"])


def _no_digests(data: bytes) -> list[str]:
    return [ln for ln in data.decode().splitlines() if '"digest"' not in ln]


# -- engines -----------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [2, 4])
def test_process_pool_gives_the_same_bytes(mini: tuple[config.Params, Path], reference: dict[str, bytes],
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    params, d = mini
    monkeypatch.setattr(sm, "SHARD_BYTES", 500)  # ~30 shards, so every worker gets several, out of order
    assert run_curate(params, d, tmp_path / "out", Engine("local", workers)) == reference


def _stage_outputs(proj: Project) -> dict[str, str]:
    return {n: hashlib.sha256((proj.root / "data/curated" / n).read_bytes()).hexdigest() for n in OUTPUTS}


def _with_engine(proj: Project, engine: str, workers: int) -> None:
    params = proj.params
    params["runtime"]["data"] = {"engine": engine, "workers": workers}
    proj.write_params(params)


def test_stage_workers_1_2_4_same_bytes_and_predicted_funnel(project: Project, tmp_path: Path) -> None:
    project.stage("fetch")
    seen = {}
    for workers in (1, 2, 4):
        _with_engine(project, "local", workers)
        project.stage("curate")
        seen[workers] = _stage_outputs(project)
        started = project.runs("curate")[-1][0]["body"]
        assert started["execution"] == {"engine": "local", "workers": workers}
        assert "runtime" not in started["params"]  # where it ran is not part of the recipe
    assert seen[1] == seen[2] == seen[4]
    recipes = {r[0]["body"]["recipe_digest"] for r in project.runs("curate")}
    assert len(recipes) == 1
    m = manifest.read(project.root / "data/curated/manifest.json", "curate")
    expected = make_corpus(tmp_path / "again")  # the removals the corpus was built with
    prose = m["funnel"]["corpora"]["prose"]
    assert {s: prose["removed"][s]["docs"] for s in expected} == expected
    assert prose["in"]["docs"] == 15 and prose["kept"]["docs"] == 12
    verses = m["funnel"]["corpora"]["verses"]
    assert verses["in"]["docs"] == verses["kept"]["docs"] == 6  # two books of three chapters
    assert [s["step"] for s in m["funnel"]["steps"]] == list(cm.STEPS)


# -- Ray: a real head on 127.0.0.1, and a local Ray the engine starts itself ----------------

@pytest.mark.slow
def test_ray_cluster_gives_the_same_bytes(project: Project) -> None:
    project.stage("fetch")
    project.stage("curate")
    local = _stage_outputs(project)
    with ray_head(project.root) as env:
        _with_engine(project, "ray", 2)
        project.env.update(env)
        project.stage("curate")
        assert _stage_outputs(project) == local
        started = project.runs("curate")[-1][0]["body"]
        assert started["execution"] == {"engine": "ray", "workers": 2, "ray_address": env["RAY_ADDRESS"]}


@pytest.mark.slow
def test_local_ray_started_by_the_engine_gives_the_same_bytes(project: Project) -> None:
    project.stage("fetch")
    project.stage("curate")
    local = _stage_outputs(project)
    _with_engine(project, "ray", 2)
    project.env.update(NO_UV_HOOK)
    project.stage("curate")
    assert _stage_outputs(project) == local
    assert project.runs("curate")[-1][0]["body"]["execution"] == {"engine": "ray", "workers": 2}


# -- the streamed outputs: the same bytes as written whole ---------------------------------

def _removal(i: int) -> dict:
    return {"corpus": "prose", "name": f"texts/dóc{i}.txt \"q\"", "step": "min_words", "detail": f"{i} words < 50",
            "bytes": i, "doc_id": None if i % 2 else "sha256:" + f"{i:064x}"}


@pytest.mark.parametrize("n", [0, 1, 2, manifest.BATCH + 5])
def test_streamed_manifest_is_dumps_of_the_whole(tmp_path: Path, n: int) -> None:
    whole = {"kind": "curate", "params": {"removed": []}, "sources": [], "funnel": {"corpora": {}, "steps": []},
             "removed": [_removal(i) for i in range(n)], "splits": cm._SKELETON["splits"]}
    spool = manifest.ListSpool(tmp_path / "spool.json", "removed", cm._SKELETON)
    for r in whole["removed"]:
        spool.add(r)
    manifest.write_streamed({**whole, "removed": []}, spool, tmp_path / "m.json")
    assert (tmp_path / "m.json").read_bytes() == manifest.dumps(whole)


def test_streamed_entries_are_validated(tmp_path: Path) -> None:
    spool = manifest.ListSpool(tmp_path / "spool.json", "removed", cm._SKELETON)
    spool.add({**_removal(1), "bytes": -1})
    with pytest.raises(manifest.schemas.SchemaError, match=r"removed\[0:\]"):
        spool.close()


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, 9000])
@pytest.mark.parametrize("spooled, options", [(False, parquet.WRITER), (True, parquet.WRITER), (True, cm.PARQUET)])
def test_parquet_writer_is_write_of_the_whole(tmp_path: Path, n: int, spooled: bool, options: dict) -> None:
    rng = random.Random(n)
    rows = [(f"sha256:{i:064x}", rng.choice(["a", "b"]), "src", f"n{i}", "MIT", i,
             " ".join(rng.choice(["x", "yy", "zzz", "ü"]) for _ in range(rng.randint(0, 300)))) for i in range(n)]
    whole = pa.table({f.name: pa.array([r[k] for r in rows], f.type) for k, f in enumerate(cm.SCHEMA)})
    parquet.write(whole, tmp_path / "whole.parquet", options)
    w = parquet.Writer(tmp_path / "streamed.parquet", cm.SCHEMA, spool=tmp_path if spooled else None, options=options)
    for r in rows:
        w.add((*r[:-1], r[-1].encode()) if n % 2 else r, len(r[-1]))  # str or UTF-8 bytes alike
    w.close()
    assert (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert pq.read_table(tmp_path / "streamed.parquet").equals(whole)
    column = pq.ParquetFile(tmp_path / "streamed.parquet").metadata.row_group(0).column
    dictionary = {f.name: column(i).has_dictionary_page for i, f in enumerate(cm.SCHEMA)}
    assert dictionary == {f.name: options is parquet.WRITER or f.name in ("corpus", "source", "license")
                          for f in cm.SCHEMA}



def test_parquet_writer_caps_a_row_group_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet, "ROW_GROUP_BYTES", 1000)
    w = parquet.Writer(tmp_path / "t.parquet", cm.SCHEMA, spool=tmp_path)
    for i in range(10):
        w.add(("d", "c", "s", f"n{i}", "MIT", 300, "x" * 300), 300)
    w.close()
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 2]


def test_writing_row_groups_does_not_import_pandas(tmp_path: Path) -> None:
    """pa.array over a Python list imports pandas (+50 MB of RSS, 0.5 CPU s in the stage: measured)."""
    code = ("import sys; from pathlib import Path; from marin.data import curate as cm, parquet; "
            f"w = parquet.Writer(Path({str(tmp_path / 't.parquet')!r}), cm.SCHEMA, spool=Path({str(tmp_path)!r}), "
            "options=cm.PARQUET); w.add(('d', 'c', 's', 'n', 'MIT', 3, 'abc'), 3); w.close(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert pq.read_table(tmp_path / "t.parquet")["n_bytes"].to_pylist() == [3]
