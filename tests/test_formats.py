"""Input formats, each on a hand-built fixture: JSONL gzip and zstd, Parquet by text column
(grouped or not), per-record licenses; archives read as streams in path order whatever
their stored order; one-line errors that name the member and line; decompression bombs."""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin import config
from marin.data import archive
from marin.errors import StageError
from tests.conftest import Project, make_corpus, make_text, mini_params, new_project
from tests.test_curate_scale import run_curate


def params_for(src: Path, *extracts: dict[str, Any], license: str = "CC0-1.0") -> config.Params:
    p = mini_params(src)
    p["fetch"]["sources"][0].update(locator=str(src), license=license, extract=list(extracts))
    return config.parse(p)


def docs(tmp_path: Path, src: Path, *extracts: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """name -> (corpus, license, text) of every kept document."""
    out = tmp_path / "out"
    run_curate(params_for(src, *extracts), src, out)
    rows: dict[str, tuple[str, str, str]] = {}
    for split in ("train", "validation"):
        t = pq.read_table(out / f"{split}.parquet").to_pylist()
        rows.update({r["name"]: (r["corpus"], r["license"], r["text"]) for r in t})
    return rows


def records(n: int, seed: int = 1, **extra: Any) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": i, "text": make_text(rng, 10), **{k: v(i) for k, v in extra.items()}} for i in range(n)]


def jsonl(recs: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in recs).encode()


LICENSES = {0: "CC-BY-4.0", 1: None, 2: "MIT"}  # None: the record has no license of its own


def test_jsonl_gz_and_zst_with_record_licenses(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    recs = records(6, lic=lambda i: LICENSES[i % 3])
    (src / "data" / "a.jsonl.gz").write_bytes(gzip.compress(jsonl(recs[:3]), mtime=0))
    (src / "data" / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(recs[3:])))
    got = docs(tmp_path, src, {"corpus": "web", "include": ["data/*"], "format": "jsonl", "text_field": "text",
                               "license_field": "lic"})
    expected = {f"data/{'a.jsonl.gz' if i < 3 else 'b.jsonl.zst'}#{i % 3 + 1}":
                ("web", LICENSES[i % 3] or "CC0-1.0", r["text"].strip()) for i, r in enumerate(recs)}
    assert got == expected


def test_parquet_text_column_with_licenses_and_groups(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    recs = records(9, chapter=lambda i: i // 3 + 1, lic=lambda i: "MIT" if i < 3 else None)
    pq.write_table(pa.table({"body": [r["text"] for r in recs], "chapter": [r["chapter"] for r in recs],
                             "lic": [r["lic"] for r in recs], "other": list(range(9))}), src / "t.parquet",
                   row_group_size=2)  # groups cross the file's row groups
    rows = docs(tmp_path, src, {"corpus": "pq", "include": ["*.parquet"], "format": "parquet", "text_field": "body",
                                "license_field": "lic"})
    assert rows == {f"t.parquet#{i + 1}": ("pq", "MIT" if i < 3 else "CC0-1.0", r["text"].strip())
                    for i, r in enumerate(recs)}
    grouped = docs(tmp_path / "g", src, {"corpus": "pq", "include": ["*.parquet"], "format": "parquet",
                                         "text_field": "body", "license_field": "lic", "group_by": ["chapter"]})
    assert grouped == {f"t.parquet#{c}": ("pq", "MIT" if c == 1 else "CC0-1.0",
                                          "\n".join(r["text"] for r in recs[3 * (c - 1): 3 * c]).strip())
                       for c in (1, 2, 3)}


def _tar(path: Path, files: dict[str, bytes], order: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name in order:
            ti = tarfile.TarInfo(name)
            ti.size = len(files[name])
            tf.addfile(ti, io.BytesIO(files[name]))
    return path


def test_archives_in_any_stored_order_give_the_same_bytes(tmp_path: Path) -> None:
    corpus = tmp_path / "mini"
    make_corpus(corpus)
    files = {p.relative_to(corpus).as_posix(): p.read_bytes() for p in sorted(corpus.rglob("*")) if p.is_file()}
    params = config.parse(mini_params(corpus))
    want = run_curate(params, corpus, tmp_path / "dir")
    backwards = _tar(tmp_path / "backwards.tar.gz", files, sorted(files, reverse=True))  # decompressed once to spool
    forwards = _tar(tmp_path / "forwards.tar.gz", files, sorted(files))
    z = tmp_path / "x.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files, reverse=True):
            zf.writestr(name, files[name])
    for i, a in enumerate((backwards, forwards, z)):
        assert run_curate(params, a, tmp_path / f"out{i}") == want, a.name
    spool = tmp_path / "spool"
    spool.mkdir()
    names = [m.name for m in archive.open_members(backwards, ("*",), (), spool)]
    assert names == sorted(files) and not list(spool.iterdir())  # the spooled copy is gone afterwards


# -- errors: one line naming the member, the line and what to do --------------------------

def _jsonl_case(tmp_path: Path, body: bytes, **extract: Any) -> StageError:
    src = tmp_path / "src"
    src.mkdir()
    (src / "r.jsonl").write_bytes(body)
    ex = {"corpus": "r", "include": ["r.jsonl"], "format": "jsonl", "text_field": "text", **extract}
    with pytest.raises(StageError) as e:
        run_curate(params_for(src, ex), src, tmp_path / "out")
    assert "\n" not in str(e.value)
    return e.value


def test_group_records_must_be_consecutive(tmp_path: Path) -> None:
    recs = records(4, chapter=lambda i: [1, 1, 2, 1][i])
    e = _jsonl_case(tmp_path, jsonl(recs), group_by=["chapter"])
    assert "r.jsonl line 4: records of group (1,) again, after other groups (it began at line 1)" in str(e)
    assert "sort the file by the group_by fields" in str(e)


def test_a_bad_json_line_is_named(tmp_path: Path) -> None:
    body = jsonl(records(2)) + b'{"text": unquoted}\n'
    e = _jsonl_case(tmp_path, body)
    assert "member 'r.jsonl' line 3: not a JSON record with field(s) ['text']" in str(e)


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    body = jsonl(records(1)) + b'{"text": "caf\xe9"}\n'
    e = _jsonl_case(tmp_path, body)
    assert "member 'r.jsonl' line 2: not UTF-8" in str(e) and "re-encode" in str(e)


def test_a_license_must_be_a_string(tmp_path: Path) -> None:
    e = _jsonl_case(tmp_path, jsonl(records(2, lic=lambda i: 5)), license_field="lic")
    assert "line 1: lic is 5, not a license" in str(e)


def test_one_group_has_one_license(tmp_path: Path) -> None:
    recs = records(2, chapter=lambda i: 1, lic=lambda i: ["MIT", "CC-BY-4.0"][i])
    e = _jsonl_case(tmp_path, jsonl(recs), group_by=["chapter"], license_field="lic")
    assert "line 2: license 'CC-BY-4.0' differs from 'MIT'" in str(e)


@pytest.mark.parametrize("column, message", [
    ("nope", "no column 'nope' (it has body, n); set text_field"),
    ("n", "column 'n' is int64, not text"),
])
def test_parquet_columns_are_checked(tmp_path: Path, column: str, message: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"body": ["x"], "n": [1]}), src / "t.parquet")
    with pytest.raises(StageError, match=re.escape(message)):
        run_curate(params_for(src, {"corpus": "t", "include": ["*.parquet"], "format": "parquet",
                                    "text_field": column}), src, tmp_path / "out")


@pytest.mark.parametrize("name, data, message", [
    ("zeros.jsonl.gz", gzip.compress(b" " * (8 << 20), mtime=0),  # 8 MiB of spaces: > 200x, over the 1 MiB floor
     r"member 'zeros.jsonl.gz' expands to over [\d,]+ bytes, more than 200x"),
    ("zeros.jsonl.zst", zstandard.ZstdCompressor().compress(b" " * (8 << 20)),
     r"member 'zeros.jsonl.zst' expands to over [\d,]+ bytes, more than 200x"),
    ("r.jsonl.gz", gzip.compress(jsonl(records(50)), mtime=0)[:-40],
     r"member 'r.jsonl.gz' is corrupt .*fetch it again"),
], ids=["gzip-bomb", "zstd-bomb", "truncated-gzip"])
def test_a_hostile_compressed_member_is_refused(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / name).write_bytes(data)
    with pytest.raises(StageError, match=message):
        run_curate(params_for(src, {"corpus": "z", "include": ["*"], "format": "jsonl", "text_field": "text"}), src,
                   tmp_path / "out")


# -- end to end: params with the new formats load, fetch and curate ----------------------

def test_stage_curates_every_format(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    recs = records(6, lic=lambda i: LICENSES[i % 3])
    (src / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(recs)))
    pq.write_table(pa.table({"body": [r["text"] for r in recs]}), src / "b.parquet")
    params = mini_params(src)
    params["fetch"]["sources"][0]["extract"] = [
        {"corpus": "web", "include": ["*.zst"], "format": "jsonl", "text_field": "text", "license_field": "lic"},
        {"corpus": "table", "include": ["*.parquet"], "format": "parquet", "text_field": "body"},
    ]
    proj: Project = new_project(tmp_path / "proj", params)
    proj.stage("fetch")
    proj.stage("curate")
    m = json.loads((proj.root / "data/curated/manifest.json").read_text())
    # the Parquet texts are the JSONL ones again: exact duplicates across formats, first occurrence kept
    assert [(r["corpus"], r["step"], r["detail"]) for r in m["removed"]] == [
        ("table", "exact_dedup", f"identical to a.jsonl.zst#{i}") for i in range(1, 7)]
    kept = [r for s in ("train", "validation")
            for r in pq.read_table(proj.root / f"data/curated/{s}.parquet").to_pylist()]
    assert sorted((r["name"], r["license"]) for r in kept) == [
        (f"a.jsonl.zst#{i + 1}", LICENSES[i % 3] or "CC0-1.0") for i in range(6)]
    assert m["funnel"]["corpora"]["web"]["license"] == "CC0-1.0"  # the source's; per document in Parquet
