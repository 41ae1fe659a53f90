"""Compressed streams read one after another, bounded: gzip, bzip2, xz and zstd.

:class:`Streams` reads a file's concatenated streams as the standard library's readers do, with
two bounds they lack: an empty stream followed by more data is refused (liblzma's auto format
reads zero bytes as endless empty .lzma streams: 10 GiB of zeros named .tar.xz gave no answer
in 120 s), and the output is capped (a decompression bomb).
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

import zstandard

from marin.errors import StageError
from marin.fsutil import shown

MAX_RATIO = 200  # deflate tops out near 1032:1; text compresses 3-10:1
ZSTD_MAX_WINDOW = 1 << 27  # zstd's default limit, spelled out: a frame cannot ask for more memory
CHUNK = 1 << 16  # compressed bytes read at a time
STARVED = 1 << 20  # zstd input that may give no output before the file is refused


if TYPE_CHECKING:  # zlib's decompressor type is not importable under its typeshed name
    Decompressor: TypeAlias = zlib._Decompress | bz2.BZ2Decompressor | lzma.LZMADecompressor


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def read_exactly(f: Readable, n: int) -> bytes:
    parts, got = [], 0
    while got < n and (b := f.read(n - got)):
        parts.append(b)
        got += len(b)
    return b"".join(parts)


FORMATS = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bzip2", ".tbz2": "bzip2", ".xz": "xz", ".txz": "xz",
            ".zst": "zstd"}


def _decompressor(fmt: str) -> Decompressor:
    if fmt == "gzip":
        return zlib.decompressobj(wbits=31)
    if fmt == "bzip2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)  # not AUTO: that reads 13 zero bytes as an empty .lzma stream


class _Fed:
    """``raw`` read for zstd's reader, which may read any amount: past STARVED bytes read
    with no output (empty or skippable frames; zstd gives output every block of 128 KiB at most),
    the file is refused."""

    def __init__(self, raw: Readable, refuse: Callable[[], StageError]):
        self.raw, self.refuse, self.since = raw, refuse, 0

    def read(self, n: int = -1) -> bytes:
        if self.since > STARVED:
            raise self.refuse()
        data = self.raw.read(n)
        self.since += len(data)
        return data


class Streams:
    """The decompressed bytes of ``raw``, a gzip, bzip2, xz or zstd file (format from ``name``),
    concatenated streams read one after another. An empty stream with more data after it is
    refused: a run of zeros or of empty streams would otherwise be read for ever, giving nothing
    (liblzma's auto format reads zeros as endless empty streams); for zstd, STARVED bytes giving
    nothing. Bytes after the last stream that begin no stream end the data, as for the standard
    library's readers (xz's stream padding is zeros). Past ``limit`` bytes out, a decompression bomb."""

    def __init__(self, raw: Readable, name: str, archive: Path, limit: int | None = None, label: str | None = None):
        self.fmt = FORMATS[Path(name.lower()).suffix]
        self.raw, self.archive, self.limit, self.label = raw, archive, limit, label
        self.out, self.done, self.stream_out, self.eof = b"", 0, 0, False
        if self.fmt == "zstd":
            self.fed = _Fed(raw, self._empty)
            self.zr = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
                self.fed, read_across_frames=True)  # pyright: ignore[reportArgumentType]
        else:
            self.d = _decompressor(self.fmt)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = 1 << 20 if n is None or n < 0 else n
        if self.fmt == "zstd":
            data = self.zr.read(n)
            self.fed.since = 0 if data else self.fed.since
        else:
            while not self.out and not self.eof:
                self._step(n)
            data, self.out = self.out[:n], self.out[n:]
        self.done += len(data)
        if self.limit is not None and self.done > self.limit:
            raise StageError(f"{self._where()} expands to over {self.limit:,} bytes, more than {MAX_RATIO}x its "
                             "stored size; refusing it (a decompression bomb?): fetch it again")
        return data

    def _step(self, n: int) -> None:
        d = self.d
        if d.eof:
            self._next_stream(n)
            return
        if isinstance(d, bz2.BZ2Decompressor | lzma.LZMADecompressor):
            needed = d.needs_input
            data = self.raw.read(CHUNK) if needed else b""
        else:  # gzip
            needed, data = True, d.unconsumed_tail or self.raw.read(CHUNK)
        if not data and needed:
            raise EOFError(f"{self.fmt} data ended before the end of its stream (truncated?)")
        self.out = d.decompress(data, n)
        self.stream_out += len(self.out)

    def _next_stream(self, n: int) -> None:
        rest = self.d.unused_data or self.raw.read(CHUNK)
        if not rest:
            self.eof = True
            return
        if self.stream_out == 0:
            raise self._empty()
        self.d = _decompressor(self.fmt)
        try:
            self.out = self.d.decompress(rest, n)
        except (OSError, EOFError, lzma.LZMAError, zlib.error):
            self.eof, self.out = True, b""  # not a stream: the data ended before it
        self.stream_out = len(self.out)

    def _empty(self) -> StageError:
        return StageError(f"{self._where()} has an empty {self.fmt} stream with more data after it (a run of "
                          "compressed zeros or empty streams?); refusing it: fetch it again")

    def _where(self) -> str:
        return shown(self.archive) + (f": member {self.label!r}" if self.label else "")
