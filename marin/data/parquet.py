"""Parquet with fixed writer settings, so the same table gives the same bytes every run."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Every setting that could vary by default or by version is spelled out.
WRITER = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "data_page_size": 1 << 20,
    "version": "2.6",
    "data_page_version": "1.0",
    "use_byte_stream_split": False,
    "write_page_index": False,
    "store_schema": True,
}
ROW_GROUP_ROWS = 4096


def write(table: pa.Table, path: Path) -> None:
    """Write ``table`` deterministically (no timestamps; fixed row groups)."""
    table = table.replace_schema_metadata(None)
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, **WRITER)


def read(path: Path, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=columns)
