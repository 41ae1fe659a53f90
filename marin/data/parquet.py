"""Parquet with fixed writer settings, so the same table gives the same bytes every run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
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
# a streamed row group also ends here, so long documents cannot grow it without bound; readers
# hold about 2x a row group's text however few rows they ask for (pyarrow iter_batches, measured:
# +113 MB for a 49 MB group), so this bounds tokenize's memory as well as curate's
ROW_GROUP_BYTES = 4 << 20


def settings(dictionary: tuple[str, ...], batch_rows: int, zstd_level: int) -> dict[str, Any]:
    """:data:`WRITER` with dictionary encoding for the named columns only (a column of
    distinct long texts gains nothing from it, and the encoder copies a whole batch of them
    into its memo table before it gives up), ``batch_rows`` values encoded at a time (a page
    is cut only between batches: pyarrow's 1024 rows of 20 KB documents make 20 MB pages)
    and zstd at ``zstd_level``."""
    return {**WRITER, "use_dictionary": list(dictionary), "write_batch_size": batch_rows,
            "compression_level": zstd_level}


def write(table: pa.Table, path: Path, options: dict[str, Any] = WRITER) -> None:
    """Write ``table`` deterministically (no timestamps; fixed row groups) with ``options``."""
    table = table.replace_schema_metadata(None)
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, **options)


def read(path: Path, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=columns)


class Writer:
    """Rows appended in order, written one row group at a time with :data:`WRITER`: a group
    ends after ROW_GROUP_ROWS rows or once its rows' sizes reach ROW_GROUP_BYTES. Below
    that size the file is byte for byte what :func:`write` makes of the same rows. With
    ``spool`` (a directory), a pending group's strings wait there, not in memory.
    ``options``: the writer settings, as :func:`write` takes them."""

    def __init__(self, path: Path, schema: pa.Schema, spool: Path | None = None, options: dict[str, Any] = WRITER):
        self.path, self.schema, self.options = path, schema.remove_metadata(), options
        self.spool = [spool / f"{path.name}.{f.name}.pending" if spool else None for f in self.schema]
        self.columns = self._columns()
        self.pending = self.size = self.rows = 0
        self._pq: pq.ParquetWriter | None = None

    def _columns(self) -> list[_Column]:
        return [_Column(f.type, s) for f, s in zip(self.schema, self.spool, strict=True)]

    def add(self, row: tuple[Any, ...], size: int) -> None:
        """Append ``row`` (one value per column; str or UTF-8 bytes for strings); ``size``:
        what it costs in memory, in bytes."""
        for col, v in zip(self.columns, row, strict=True):
            col.append(v)
        self.pending += 1
        self.size += size
        self.rows += 1
        if self.pending >= ROW_GROUP_ROWS or self.size >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pq is None:
            self._pq = pq.ParquetWriter(self.path, self.schema, **self.options)
        table = pa.Table.from_arrays([c.array() for c in self.columns], schema=self.schema)
        self._pq.write_table(table, row_group_size=ROW_GROUP_ROWS)
        del table
        for c in self.columns:
            c.close()
        self.columns = self._columns()
        self.pending = self.size = 0

    def close(self) -> None:
        """Write the last row group and the footer (nothing at all if no row was added)."""
        if self.pending:
            self._flush()
        for c in self.columns:
            c.close()
        if self._pq is not None:
            self._pq.close()


class _Column:
    """One column of a pending row group. Strings go straight into one Arrow buffer (or a
    file, read back memory-mapped): ``pa.array`` over a list of 25 MB of texts peaks near
    6x their size, and joining a list of bytes leaves glibc's heap fragmented (measured)."""

    def __init__(self, type: pa.DataType, spool: Path | None):
        self.type, self.spool = type, spool
        self.values: list[Any] = []
        self.string = pa.types.is_string(type)
        self.data: Any = None
        self.mapped: pa.MemoryMappedFile | None = None
        if self.string:
            # buffered: a row is one small write per string column
            if spool is None:
                self.data = pa.BufferOutputStream()
            else:
                self.data = pa.BufferedOutputStream(pa.OSFile(str(spool), "wb"), 1 << 16)
            self.offsets = [0]

    def append(self, v: Any) -> None:
        if not self.string:
            self.values.append(v)
            return
        b = v if isinstance(v, bytes) else v.encode()
        self.data.write(b)
        self.offsets.append(self.offsets[-1] + len(b))

    def array(self) -> pa.Array:
        if not self.string:
            if pa.types.is_integer(self.type) and None not in self.values:
                # from the buffer: pa.array over a Python list imports pandas (+50 MB, 0.5 CPU s; measured)
                data = np.array(self.values, dtype=np.dtype(str(self.type)))  # int64 is numpy's int64
                return pa.Array.from_buffers(self.type, len(self.values), [None, pa.py_buffer(data)])
            return pa.array(self.values, self.type)
        if self.offsets[-1] >= 2**31:
            raise ValueError(f"{self.offsets[-1]:,} bytes of strings in one row group; the limit is 2 GiB")
        if self.spool is None:
            data = self.data.getvalue()
        elif self.offsets[-1] == 0:  # an empty file cannot be mapped
            self.data.close()
            data = pa.py_buffer(b"")
        else:
            self.data.close()
            self.mapped = mapped = pa.memory_map(str(self.spool))
            data = mapped.read_buffer()
        offsets = pa.py_buffer(np.array(self.offsets, dtype=np.int32))
        arr = pa.StringArray.from_buffers(len(self.offsets) - 1, offsets, data)
        arr.validate(full=True)  # UTF-8, as pa.array checks
        return arr

    def close(self) -> None:
        if self.mapped is not None:
            self.mapped.close()
        if self.data is not None and not self.data.closed:
            self.data.close()
