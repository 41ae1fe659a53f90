"""What an archive's directory or a Parquet file's footer declares, checked before a byte of data
is decompressed: how many members, how much they expand to in all, how large a row group is.

Each member or value on its own may be within its bound and the whole still be a bomb: 10,000 zip
members of 1 MiB of deflated zeros (10 MB) expand to 10 GiB, a million empty tar headers cost
their ``TarInfo`` objects, a few MB of zstd Parquet decode to GBs. The bounds here are on the
whole: at most :data:`MAX_MEMBERS` members, at most ``MAX_RATIO`` times the stored size in all,
at most :data:`MAX_ROW_GROUP_BYTES` decoded per Parquet row group (Arrow builds one at a time), and
a Parquet file's strings at most ``MAX_RATIO`` times its size once their dictionaries are expanded.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from marin.data.streams import MAX_RATIO
from marin.errors import StageError
from marin.fsutil import shown

# members (tar headers or zip entries) in one archive: 100,000 empty tar headers took 2.1 s and
# 46 MB to walk in-process, and curate took 7.3 s and 257 MB to refuse 200,000 (2 shared cores):
# a flood is refused in ~4 s
MAX_MEMBERS = 100_000
ZIP_DIRECTORY_BYTES = MAX_MEMBERS * 256  # a central directory larger than this is refused unparsed
RATIO_MIN_BYTES = 1 << 20  # below this a high ratio cannot hurt
MAX_ROW_GROUP_BYTES = 256 << 20  # one Parquet row group's selected columns, uncompressed
_EOCD = struct.Struct("<4s4H2LH")  # zip's end of central directory record
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # and its zip64 form
_LOCATOR = struct.Struct("<4sLQL")


def _refuse(archive: Path, why: str, fix: str = "repack it with fewer members") -> StageError:
    return StageError(f"{shown(archive)}: {why}; refusing the archive (nothing was extracted): {fix}, and pin "
                      "its new sha256 in params.yaml")


def too_many(archive: Path, n: int) -> StageError | None:
    """The refusal for a member count ``n`` over :data:`MAX_MEMBERS`, or None."""
    if n <= MAX_MEMBERS:
        return None
    return _refuse(archive, f"has over {MAX_MEMBERS:,} members (a flood of headers?), over the cap per archive")


def expansion(archive: Path, total: int) -> StageError | None:
    """The refusal for members of ``total`` bytes in all, over MAX_RATIO times the archive's size."""
    limit = max(archive.stat().st_size * MAX_RATIO, RATIO_MIN_BYTES)
    if total <= limit:
        return None
    return _refuse(archive, f"members expand to {total:,} bytes in all, over {MAX_RATIO}x its "
                   f"{archive.stat().st_size:,} stored bytes (a zip bomb of many members?)", "repack it")


def zip_directory(archive: Path) -> None:
    """Refuse a zip whose end record declares over :data:`MAX_MEMBERS` entries or a central directory
    over :data:`ZIP_DIRECTORY_BYTES`, before ``zipfile`` builds an object for each entry."""
    with open(archive, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(size - (1 << 16) - _EOCD.size, 0))  # the record, and a comment of up to 64 KiB before it
        tail = f.read((1 << 16) + _EOCD.size)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            return  # no end record: zipfile says so in its own words
        entries, cd_size = _EOCD.unpack_from(tail, at)[4], _EOCD.unpack_from(tail, at)[5]
        if (entries == 0xFFFF or cd_size == 0xFFFFFFFF) and at >= _LOCATOR.size:
            entries, cd_size = _zip64(f, tail[at - _LOCATOR.size:at], entries, cd_size)
    err = too_many(archive, entries)
    if err is None and cd_size > ZIP_DIRECTORY_BYTES:
        err = _refuse(archive, f"has a central directory of {cd_size:,} bytes, over the {ZIP_DIRECTORY_BYTES:,}-byte "
                      "cap (a flood of entries?)")
    if err is not None:
        raise err


def _zip64(f: Any, locator: bytes, entries: int, cd_size: int) -> tuple[int, int]:
    sig, _, offset, _ = _LOCATOR.unpack(locator)
    if sig != b"PK\x06\x07":
        return entries, cd_size
    f.seek(offset)
    rec = f.read(_EOCD64.size)
    if len(rec) < _EOCD64.size or rec[:4] != b"PK\x06\x06":
        return entries, cd_size
    fields = _EOCD64.unpack(rec)
    return fields[7], fields[8]


def row_groups(path: Path, meta: Any, columns: list[str], where: str) -> None:
    """Refuse a Parquet file (its footer ``meta``) whose ``columns`` declare, uncompressed, over
    :data:`MAX_ROW_GROUP_BYTES` in one row group or over MAX_RATIO times the file's size in all."""
    limit = max(path.stat().st_size * MAX_RATIO, RATIO_MIN_BYTES)
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        size = sum(rg.column(i).total_uncompressed_size for i in range(rg.num_columns)
                   if rg.column(i).path_in_schema.split(".")[0] in columns)
        total += size
        if size > MAX_ROW_GROUP_BYTES:
            why = f"declares {size:,} bytes uncompressed, over the {MAX_ROW_GROUP_BYTES:,}-byte cap per row group"
        elif total > limit:
            why = (f"takes the file to {total:,} bytes uncompressed, over {MAX_RATIO}x its "
                   f"{path.stat().st_size:,} stored bytes (a decompression bomb?)")
        else:
            continue
        raise StageError(f"{where} row group {g} ({', '.join(columns)}) {why}; refusing the file unread: write it "
                         "with smaller row groups (pyarrow: row_group_size), or fetch it again")


def decoded(path: Path, total: int, where: str) -> None:
    """Refuse a Parquet file whose string values, as their dictionaries' lengths say, decode to over
    MAX_RATIO times its size in all (a footer counts a dictionary page once, however many rows use it)."""
    limit = max(path.stat().st_size * MAX_RATIO, RATIO_MIN_BYTES)
    if total > limit:
        raise StageError(f"{where}: its strings decode to {total:,} bytes or more, over {MAX_RATIO}x its "
                         f"{path.stat().st_size:,} stored bytes (a dictionary bomb?); refusing the file before "
                         "they are decoded: split the file or drop its repeated rows, or fetch it again")
