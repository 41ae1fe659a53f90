"""The input side of curation: every source's documents cut into shards by input alone.

A shard is a bundle of whole text members, a line-aligned chunk of a JSONL member or a
batch of Parquet rows, always within one extract of one source and in document order
(params order, members sorted by path). :func:`read_records` reads a JSONL or Parquet shard's
records back with their line or row numbers, so errors name the line of the whole member.
"""

from __future__ import annotations

import codecs
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from marin.config import CurateParams, Extract, Source
from marin.data import archive, parquet_rows
from marin.errors import StageError
from marin.fsutil import shown

SHARD_BYTES = 4 << 20  # input per shard: cheap to ship, and many shards per worker on a real corpus


@dataclass(frozen=True)
class Origin:
    corpus: str
    source: str
    license: str  # the source's


@dataclass(frozen=True)
class Oversize:
    """A record or document over ``curate.max_document_bytes``, dropped unread: at least this many bytes."""

    bytes: int


def oversize(where: str, n: int, p: CurateParams) -> Oversize:
    """The record at ``where`` (file, member, record) has at least ``n`` bytes, over the cap:
    refused in one line (``curate.oversize: refuse``), else an :class:`Oversize` to drop."""
    if p.oversize == "refuse":
        raise StageError(f"{where}: a record or document of {n:,} bytes or more, over the "
                         f"{p.max_document_bytes:,}-byte cap (curate.max_document_bytes); refusing the input (a "
                         "broken file or a decompression bomb?): raise curate.max_document_bytes, or set "
                         "curate.oversize: drop to count such documents as removed")
    return Oversize(n)


@dataclass(frozen=True)
class Shard:
    """A slice of one extract's input, in document order."""

    archive: str  # as shown in errors
    origin: Origin
    ex: Extract
    p: CurateParams
    stream: int  # one member as read by one extract: groups are joined only within it
    member: str
    first: int  # number of the first line (JSONL) or row (Parquet), from 1
    data: Any  # text: [(member, bytes | Oversize)]; jsonl: bytes | Oversize (a skipped line); parquet: Rows


def shards(sources: list[tuple[Source, Path]], p: CurateParams, spool: Path) -> Iterator[Shard]:
    """Every source's documents (in params order, members sorted by path) as shards."""
    stream = 0
    for source, path in sources:
        for ex in source.extract:
            if ex.format == "messages":  # instruction data: the instructions stage reads it (marin.instruct)
                continue
            found, bundle, size = False, [], 0
            o = Origin(ex.corpus, source.name, source.license)
            for m in archive.open_members(path, ex.include, ex.exclude, spool):
                found, stream = True, stream + 1
                make = partial(Shard, shown(path), o, ex, p, stream, m.name)
                where = f"{shown(path)}: member {m.name!r}"
                if ex.format == "text":
                    bundle.append((m.name, _whole(m, where, p)))
                    size += len(bundle[-1][1]) if isinstance(bundle[-1][1], bytes) else 0
                    if size >= SHARD_BYTES:
                        yield Shard(shown(path), o, ex, p, stream, bundle[0][0], 1, bundle)
                        bundle, size = [], 0
                elif ex.format == "jsonl":
                    over = partial(_over_line, where, p)
                    for first, chunk in line_chunks(archive.decompressed(m, path), cap=p.max_document_bytes,
                                                    over=over):
                        yield make(first, chunk)
                else:
                    yield from (make(first, rows) for first, rows in _parquet_rows(m, path, ex, p, spool))
            if bundle:
                yield Shard(shown(path), o, ex, p, stream, bundle[0][0], 1, bundle)
            if not found:
                raise StageError(f"fetch.sources[{source.name}].extract[{ex.corpus}]: no member of {path.name} "
                                 f"matches {list(ex.include)}; check the include patterns")


def _whole(m: archive.Member, where: str, p: CurateParams) -> bytes | Oversize:
    """A text member's bytes, read only if within the cap (its declared size, then what it holds)."""
    if m.size > p.max_document_bytes:
        return oversize(where, m.size, p)
    data = m.stream.read(p.max_document_bytes + 1)
    return oversize(where, len(data), p) if len(data) > p.max_document_bytes else data


def _over_line(where: str, p: CurateParams, line: int, n: int) -> Oversize:
    return oversize(f"{where} line {line}", n, p)


def _newlines(data: bytes) -> int:
    """Line ends in ``data``, counted as the old whole-member reader did: \\r\\n, \\r or \\n."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def _read(stream: archive.Readable, n: int) -> bytes:
    parts, got = [], 0
    while got < n and (b := stream.read(n - got)):
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def line_chunks(stream: archive.Readable, size: int = SHARD_BYTES, cap: int | None = None,
                over: Callable[[int, int], Oversize] | None = None) -> Iterator[tuple[int, bytes | Oversize]]:
    """(number of the first line, bytes) of consecutive chunks of about ``size`` bytes that
    end at a line end (a longer line makes a longer chunk); a leading BOM is dropped. A line
    that grows past ``cap`` bytes is never held: ``over(line, bytes so far)`` refuses it (raises)
    or gives the :class:`Oversize` that comes instead of it, and the rest of it is skipped unread."""
    line, rest, start = 1, b"", True
    while True:
        block = _read(stream, size)
        buf = rest + block
        if start:
            if block and len(buf) < len(codecs.BOM_UTF8):
                rest = buf
                continue
            buf, start = buf.removeprefix(codecs.BOM_UTF8), False
        if not block:
            if buf:
                yield line, buf
            return
        cut = buf.rfind(b"\n") + 1 or buf.rfind(b"\r", 0, len(buf) - 1) + 1  # never between \r and \n
        if cut == 0:
            rest = buf
            if cap is not None and over is not None and len(rest) > cap:
                dropped = over(line, len(rest))
                skipped, rest = _skip_line(stream, rest, size)
                yield line, Oversize(dropped.bytes + skipped)
                line += 1
            continue
        chunk, rest = buf[:cut], buf[cut:]
        yield line, chunk
        line += _newlines(chunk)


def _skip_line(stream: archive.Readable, buf: bytes, size: int) -> tuple[int, bytes]:
    """Read past the end of the line ``buf`` begins (held bytes: ``buf``), ``size`` bytes at a
    time: (bytes skipped after ``buf``, the bytes after the line end)."""
    skipped, tail = 0, b"\r" if buf.endswith(b"\r") else b""
    while True:
        block = _read(stream, size)
        if not block:
            return skipped, b""
        if tail == b"\r":  # a \r that ended the previous block: the line ended there (\r\n: one end)
            return skipped, block.removeprefix(b"\n")
        ends = [i for i in (block.find(b"\n"), block.find(b"\r")) if i >= 0]
        if ends:
            i = min(ends)
            if i == len(block) - 1 and block[i:] == b"\r":  # a \n may follow in the next block
                tail = b"\r"
                skipped += i
                continue
            return skipped + i, block[i + 2:] if block[i:i + 2] == b"\r\n" else block[i + 1:]
        skipped += len(block)


def _parquet_rows(m: archive.Member, path: Path, ex: Extract, p: CurateParams,
                  spool: Path) -> Iterator[tuple[int, parquet_rows.Rows]]:
    where = f"{shown(path)}: member {m.name!r}"
    local = m.path
    if local is None:  # inside a tar or zip: Parquet needs to seek, so the member is copied out (to disk)
        local = spool / "member.parquet"
        with open(local, "wb") as f:
            shutil.copyfileobj(m.stream, f, 1 << 20)
    try:
        yield from parquet_rows.rows(local, partial(_parquet_columns, ex=ex, where=where), ex.text_field or "",
                                     p.max_document_bytes, where, partial(_over_row, where, p))
    except (pa.ArrowException, OSError) as e:
        raise StageError(f"{where}: not a readable Parquet file ({e}); check the extract's format, or fetch "
                         "it again") from None
    finally:
        if local != m.path:
            local.unlink(missing_ok=True)


def _over_row(where: str, p: CurateParams, row: int, n: int) -> Oversize:
    return oversize(f"{where} row {row}", n, p)


def _parquet_columns(schema: pa.Schema, ex: Extract, where: str) -> list[str]:
    columns = [c for c in (ex.text_field, ex.license_field, *ex.group_by) if c is not None]
    for c in dict.fromkeys(columns):
        if c not in schema.names:
            raise StageError(f"{where}: no column {c!r} (it has {', '.join(schema.names)}); set text_field, "
                             "license_field and group_by to its columns")
        t = schema.field(c).type
        if c in (ex.text_field, ex.license_field) and not parquet_rows.is_text(t):
            raise StageError(f"{where}: column {c!r} is {t}, not text; name a string column")
    return list(dict.fromkeys(columns))


Record = tuple[int, tuple[Any, ...], "str | Oversize", str | None]  # (line or row, group key, text, own license)


def read_records(sh: Shard) -> Iterator[Record]:
    """A JSONL or Parquet shard's records, in order."""
    return _jsonl_records(sh) if sh.ex.format == "jsonl" else _parquet_records(sh)


def _jsonl_records(sh: Shard) -> Iterator[Record]:
    where = f"{sh.archive}: member {sh.member!r}"
    if isinstance(sh.data, Oversize):  # a line skipped unread: its group key is unknown
        yield sh.first, (), sh.data, None
        return
    try:
        text = sh.data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = sh.first + _newlines(sh.data[: e.start])
        raise StageError(f"{where} line {line}: not UTF-8 ({e.reason}); JSON Lines are UTF-8: re-encode the "
                         "file (e.g. iconv -t UTF-8) and pin its new sha256") from None
    ex = sh.ex
    for j, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n")):
        if not line.strip():
            continue
        n = sh.first + j
        try:
            rec = json.loads(line)
            key = tuple(rec[k] for k in ex.group_by)
            value = str(rec[ex.text_field])
            own = rec.get(ex.license_field) if ex.license_field else None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            fields = [ex.text_field, *ex.group_by]
            raise StageError(f"{where} line {n}: not a JSON record with field(s) {fields}: {e!r}; fix the line, "
                             "or the extract's text_field / group_by in params.yaml") from None
        yield n, key, _capped(value, f"{where} line {n}", sh.p), _own_license(own, ex, where, f"line {n}")


def _capped(text: str, where: str, p: CurateParams) -> str | Oversize:
    """``text``, or what :func:`oversize` makes of it when its UTF-8 is over the cap."""
    if len(text) * 4 <= p.max_document_bytes:  # a character is at most 4 bytes
        return text
    n = len(text.encode())
    return oversize(where, n, p) if n > p.max_document_bytes else text


def _own_license(value: object, ex: Extract, where: str, at: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise StageError(f"{where} {at}: {ex.license_field} is {value!r}, not a license; give a license string "
                     "(an SPDX expression) or null for the source's")


def _parquet_records(sh: Shard) -> Iterator[Record]:
    ex, batch, over = sh.ex, sh.data.batch, sh.data.over
    where = f"{sh.archive}: member {sh.member!r}"
    texts: list[Any] = batch.column(ex.text_field).to_pylist()  # an oversize row's is null: never decoded
    for i, n in over.items():
        texts[i] = Oversize(n)
    owns = batch.column(ex.license_field).to_pylist() if ex.license_field else [None] * len(texts)
    keys = zip(*(batch.column(k).to_pylist() for k in ex.group_by), strict=True) if ex.group_by else None
    for i, (text, own) in enumerate(zip(texts, owns, strict=True)):
        n = sh.first + i
        key = next(keys) if keys is not None else ()
        yield n, tuple(key), "" if text is None else text, _own_license(own, ex, where, f"row {n}")
