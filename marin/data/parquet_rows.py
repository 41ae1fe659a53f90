"""A Parquet source's rows, each string value's length known before a value is decoded.

Spark, DuckDB and parquet-mr write strings dictionary-encoded: a page of small indices into a
dictionary page that the footer counts once. One 50 MB string over 120 rows is a 39 MB file that
declares 52 MB uncompressed, within every bound of :func:`marin.data.bounds.row_groups`, and
decodes to 6 GB (``iter_batches`` OOM-killed curate after 143 s). So every string column is read
as Arrow dictionaries (``read_dictionary``: Arrow keeps the dictionary page as it is, and builds
one for a plainly encoded chunk), a row's length is its dictionary value's, taken through the
indices, a text over ``curate.max_document_bytes`` is never decoded, and the rest is decoded at
most :data:`BATCH_BYTES` at a time, the whole file at most MAX_RATIO times its size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin.data import bounds
from marin.errors import StageError

BATCH_ROWS = 2048  # rows read at a time: only indices until decoded
BATCH_BYTES = 4 << 20  # decoded string bytes per batch (a longer row alone): what a shard ships
# a column chunk is read through a buffer of this size, not whole: Arrow holds about 4x a dictionary
# page while it reads one (a 50 MB page: 200 MB allocated with a buffer, 238 MB without; measured)
READ_BYTES = 1 << 20
_TEXT = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
_BYTES = (*_TEXT, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
_length = pc.binary_length  # pyright: ignore[reportAttributeAccessIssue]
_if_else = pc.if_else  # pyright: ignore[reportAttributeAccessIssue]


@dataclass(frozen=True)
class Rows:
    """A batch of one Parquet member's rows, decoded; the text of a row in ``over`` (its index in the
    batch: its length in bytes) is null, never decoded."""

    batch: pa.RecordBatch
    over: dict[int, int]


def is_text(t: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded (Arrow schema ``dictionary<values=string>``)."""
    t = t.value_type if pa.types.is_dictionary(t) else t  # pyright: ignore[reportAttributeAccessIssue]
    return any(f(t) for f in _TEXT)


def _is_bytes(t: pa.DataType) -> bool:
    t = t.value_type if pa.types.is_dictionary(t) else t  # pyright: ignore[reportAttributeAccessIssue]
    return any(f(t) for f in _BYTES)


def rows(path: Path, pick: Callable[[pa.Schema], list[str]], text: str, cap: int, where: str,
         over: Callable[[int, int], object]) -> Iterator[tuple[int, Rows]]:
    """(number of the first row, from 1; its :class:`Rows`) of the Parquet file ``path``, in order:
    the columns ``pick`` chooses from its schema (or refuses), ``text`` one of them (:func:`is_text`).
    A text over ``cap`` bytes is passed to ``over(row, bytes)``, which refuses it (raises) or lets it
    be dropped; any other value over ``cap`` is refused."""
    with pq.ParquetFile(path) as pf:  # the schema and footer, before a page is decoded
        columns = pick(pf.schema_arrow)
        bounds.row_groups(path, pf.metadata, columns, where)
        strings = [c for c in columns if _is_bytes(pf.schema_arrow.field(c).type)]
    decoded, row = 0, 1
    with pq.ParquetFile(path, read_dictionary=strings, pre_buffer=False, buffer_size=READ_BYTES) as pf:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
            sizes = {c: _sizes(batch.column(c)) for c in strings}
            big = {int(i): int(sizes[text][i]) for i in np.flatnonzero(sizes[text] > cap)}
            for i, n in big.items():
                over(row + i, n)
                sizes[text][i] = 0
            _refuse_long(sizes, text, cap, row, where)
            cost = sum(sizes.values(), np.zeros(batch.num_rows, np.int64))
            decoded += int(cost.sum())
            bounds.decoded(path, decoded, where)  # before the batch's values are decoded
            for start, end in _cuts(cost):
                dropped = {i - start: n for i, n in big.items() if start <= i < end}
                yield row + start, Rows(_decode(batch.slice(start, end - start), strings, text, set(dropped)), dropped)
            row += batch.num_rows


def _sizes(column: Any) -> np.ndarray:
    """Each row's length in bytes (a null: 0), through the dictionary without decoding a value."""
    if not pa.types.is_dictionary(column.type):  # not read as a dictionary (a nested column's leaf)
        return _length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = _length(column.dictionary).to_numpy(zero_copy_only=False).astype(np.int64)
    out = lengths[column.indices.fill_null(0).to_numpy(zero_copy_only=False)] if len(lengths) else \
        np.zeros(len(column), np.int64)
    out[column.is_null().to_numpy(zero_copy_only=False)] = 0
    return out


def _refuse_long(sizes: dict[str, np.ndarray], text: str, cap: int, row: int, where: str) -> None:
    for c, n in sizes.items():
        if c != text and (long := np.flatnonzero(n > cap)).size:
            raise StageError(f"{where} row {row + int(long[0])}: column {c!r} holds {int(n[long[0]]):,} bytes, over "
                             f"the {cap:,}-byte cap (curate.max_document_bytes); a license or group_by column holds "
                             "short values: name the right column, or fix the file")


def _cuts(cost: np.ndarray) -> Iterator[tuple[int, int]]:
    """(start, end) of consecutive runs of rows of at most BATCH_BYTES in all (a longer row alone)."""
    start, acc = 0, 0
    for i, c in enumerate(cost.tolist()):
        if i > start and acc + c > BATCH_BYTES:
            yield start, i
            start, acc = i, 0
        acc += c
    if start < len(cost):
        yield start, len(cost)


def _decode(part: pa.RecordBatch, strings: list[str], text: str, dropped: set[int]) -> pa.RecordBatch:
    """``part`` with its string columns decoded (``dictionary<string>`` to ``string``), the text of
    the rows ``dropped`` null."""
    arrays = []
    for name, column in zip(part.schema.names, part.columns, strict=True):
        if name in strings and pa.types.is_dictionary(column.type):
            indices = column.indices
            if name == text and dropped:
                mask = np.zeros(len(part), bool)
                mask[list(dropped)] = True
                indices = _if_else(pa.array(mask), pa.scalar(None, indices.type), indices)
            column = column.dictionary.take(indices)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=part.schema.names)
