"""Parquet strings bounded before they are decoded (issue 55, defect 2). Spark, DuckDB and parquet-mr
write strings dictionary-encoded, and a footer counts the dictionary page once: one 50 MB string over
120 rows is a 39 MB file that decodes to 6 GB (curate was OOM-killed after 143 s). Curate reads every
string column as dictionaries, takes each row's length from its dictionary value's, refuses (or drops,
``curate.oversize: drop``) a text over ``curate.max_document_bytes`` unread, and decodes at most 4 MiB
at a time. A column typed ``dictionary<string>`` in the file's Arrow schema is text like a plain one.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin import config
from marin.errors import StageError
from tests.conftest import WORDS, mini_params
from tests.test_bounded import curated_dropping, ledger_kept, on_file, refused, run
from tests.test_curate_scale import run_curate

BOMB_VALUE = 50 << 20  # one string: over the 16 MiB cap
BOMB_ROWS = 120  # 6 GB decoded


def _value(n: int, seed: int = 0) -> pa.StringArray:
    """One string of ``n`` bytes from 72 characters (zstd keeps ~78% of it), built without a copy."""
    data = (np.random.default_rng(seed).integers(0, 72, n, dtype=np.uint8) + 48).tobytes()
    return pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, n], np.int32)), pa.py_buffer(data))


def _texts(n: int, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(80)) + "." for _ in range(n)]


def _bomb(path: Path, good: list[str]) -> Path:
    """``good`` rows, then BOMB_ROWS of one BOMB_VALUE string: dictionary-encoded, no Arrow schema (as
    Spark, DuckDB and parquet-mr write strings)."""
    values = pa.concat_arrays([pa.array(good, pa.string()), _value(BOMB_VALUE)])
    indices = np.concatenate([np.arange(len(good)), np.full(BOMB_ROWS, len(good))]).astype(np.int32)
    table = pa.table({"text": pa.DictionaryArray.from_arrays(pa.array(indices), values)})
    pq.write_table(table, path, compression="zstd", use_dictionary=True, store_schema=False)
    meta = pq.ParquetFile(path).metadata
    assert path.stat().st_size < 40 << 20 and meta.num_row_groups == 1  # 39 MB: every footer bound passes
    assert meta.row_group(0).column(0).total_uncompressed_size < BOMB_VALUE + (1 << 20)
    return path


def test_a_dictionary_bomb_is_refused_before_a_row_is_decoded(tmp_path: Path, corpus: Path) -> None:
    proj = on_file(tmp_path, corpus, _bomb(tmp_path / "bomb.parquet", []), fmt="parquet")
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "data/raw/h/bomb.parquet: member 'bomb.parquet' row 1: a record or "
            f"document of {BOMB_VALUE:,} bytes or more, over the 16,777,216-byte cap (curate.max_document_bytes)",
            "raise curate.max_document_bytes, or set curate.oversize: drop")
    assert not (proj.root / "data" / "curated").exists()
    assert proj.runs("curate")[-1][-1]["body"]["status"] == "failed"
    ledger_kept(proj, before)


def test_a_dictionary_bombs_rows_are_dropped_unread_and_counted(tmp_path: Path, corpus: Path) -> None:
    proj = on_file(tmp_path, corpus, _bomb(tmp_path / "bomb.parquet", _texts(40)), fmt="parquet", oversize="drop")
    before = proj.ledger_files()
    m, step = curated_dropping(proj)
    assert step["removed"] == {"docs": BOMB_ROWS, "bytes": BOMB_ROWS * BOMB_VALUE}  # counted, never decoded
    assert m["splits"]["train"]["docs"] + m["splits"]["validation"]["docs"] == 40
    ledger_kept(proj, before)


def _curated(tmp_path: Path, name: str, columns: dict[str, Any], **write: Any) -> dict[str, bytes]:
    """The curated outputs of one Parquet file of ``columns`` (text, licence and group key)."""
    src = tmp_path / name / "src"
    src.mkdir(parents=True)
    pq.write_table(pa.table(columns), src / "t.parquet", **write)
    p = mini_params(src)
    p["fetch"]["sources"][0]["extract"] = [{"corpus": "pq", "include": ["t.parquet"], "format": "parquet",
                                            "text_field": "text", "license_field": "lic", "group_by": ["ch"]}]
    return run_curate(config.parse(p), src, tmp_path / name / "out")


def _dict(values: list[Any], t: pa.DataType) -> pa.Array:
    return pa.array(values, t).dictionary_encode()


@pytest.mark.parametrize("text_type, store_schema", [
    ("dictionary<string>", True),  # the Arrow schema says dictionary: was refused as "not text"
    ("dictionary<large_string>", True),
    ("large_string", True),
    ("dictionary<string>", False),  # dictionary pages without an Arrow schema: Spark's, DuckDB's strings
])
def test_a_dictionary_typed_text_column_is_curated_as_the_plain_one(tmp_path: Path, text_type: str,
                                                                    store_schema: bool) -> None:
    texts = _texts(24)
    texts[5] = texts[9] = texts[2]  # repeated values: a dictionary shares them
    lic = ["MIT" if i // 4 % 2 else None for i in range(24)]  # a group's rows share one (None: the source's)
    ch = [str(i // 4) for i in range(24)]
    plain = _curated(tmp_path, "plain", {"text": texts, "lic": lic, "ch": ch}, use_dictionary=False)
    large = "large" in text_type
    typed = {"text": (_dict if "dictionary" in text_type else pa.array)(texts, pa.large_string() if large
                                                                        else pa.string()),
             "lic": _dict(lic, pa.string()), "ch": _dict(ch, pa.string())}
    assert plain == _curated(tmp_path, "typed", typed, store_schema=store_schema)
    out = tmp_path / "plain" / "out"
    kept = [r for s in ("train", "validation") for r in pq.read_table(out / f"{s}.parquet").to_pylist()]
    assert len(kept) == 6 and sorted(r["license"] for r in kept).count("MIT") == 3  # six groups of four rows


def _params(src: Path, **extract: Any) -> config.Params:
    p = mini_params(src)
    p["fetch"]["sources"][0]["extract"] = [{"corpus": "pq", "include": ["t.parquet"], "format": "parquet",
                                            "text_field": "text", **extract}]
    return config.parse(p)


@pytest.mark.parametrize("case, message", [
    # 400 rows of one 1 MiB value (under the cap) in a ~1 MB file: 400 MiB decoded, over 200x
    ("ratio", r"member 't\.parquet': its strings decode to [\d,]+ bytes or more, over 200x its [\d,]+ stored bytes"),
    # a licence column of a 20 MiB value: not a document, so refused whatever curate.oversize says
    ("license", r"member 't\.parquet' row 1: column 'lic' holds 20,971,520 bytes, over the 16,777,216-byte cap"),
])
def test_other_dictionary_bombs_are_refused_before_decoding(tmp_path: Path, case: str, message: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    rows = 400 if case == "ratio" else 4
    value = _value((1 if case == "ratio" else 20) << 20)
    big = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), value)
    columns = {"text": big} if case == "ratio" else {"text": _texts(rows), "lic": big}
    pq.write_table(pa.table(columns), src / "t.parquet", compression="zstd", store_schema=False)
    params = _params(src, **({"license_field": "lic"} if case == "license" else {}))
    with pytest.raises(StageError, match=message):
        run_curate(params, src, tmp_path / "out")


def test_a_plainly_encoded_column_is_still_read_in_bounded_batches(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from marin.data import parquet_rows

    monkeypatch.setattr(parquet_rows, "BATCH_BYTES", 100_000)
    path = tmp_path / "t.parquet"
    texts = _texts(3000)
    pq.write_table(pa.table({"text": texts}), path, use_dictionary=False, row_group_size=1000)
    got = list(parquet_rows.rows(path, lambda s: ["text"], "text", 1 << 20, "w", lambda row, n: None))
    sizes = [sum(len(t.encode()) for t in b.batch.column("text").to_pylist()) for _, b in got]
    assert max(sizes) <= 100_000 and len(got) > 10
    firsts = [first for first, _ in got]
    assert firsts == [1, *(1 + np.cumsum([b.batch.num_rows for _, b in got[:-1]])).tolist()]
    assert [t for _, b in got for t in b.batch.column("text").to_pylist()] == texts
    assert all(b.batch.schema.field("text").type == pa.string() for _, b in got)
