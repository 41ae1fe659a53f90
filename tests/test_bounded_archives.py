"""Issue 38, defects 10 and 11: a tar is read in one streaming pass whatever its member order,
and a run of compressed zeros or empty streams is refused at the first empty stream. Each
command runs as a measured child process (tests/test_bounded.py's helpers): one line, the exit
code, under 10 s and 500 MB, the ledger kept.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import random
import tarfile
from pathlib import Path

import pytest
import zstandard

from marin.data import archive
from tests.conftest import WORDS, Project
from tests.test_bounded import bounded, ledger_kept, on_file, refused, run

ZEROS_XZ = lzma.compress(b"\0" * (64 << 20), preset=0)  # 64 MiB of zeros in ~10 KB: concatenated, a bomb


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(tarfile.USTAR_FORMAT)


def _pad(size: int) -> bytes:
    return b"\0" * (-size % 512)


def zeros_tar_xz(path: Path, names: list[str], chunks: int) -> Path:
    """A .tar.xz of members ``names`` (in that stored order), each ``chunks`` x 64 MiB of zeros,
    written as concatenated xz streams: never compressed whole (the issue's 1.2 MB for 7.5 GiB)."""
    size = chunks * (64 << 20)
    with open(path, "wb") as f:
        for name in names:
            f.write(lzma.compress(_header(name, size), preset=0))
            f.write(ZEROS_XZ * chunks)
        f.write(lzma.compress(b"\0" * 1024, preset=0))  # the end-of-archive blocks
    return path


def _doc(rng: random.Random) -> bytes:
    return (" ".join(rng.choice(WORDS) for _ in range(400)) + ".\n").encode()


# -- 10. out of path order: one streaming pass, nothing spooled whole ------------------------------

def test_an_out_of_order_tar_xz_bomb_is_refused_in_one_streaming_pass(tmp_path: Path, corpus: Path) -> None:
    src = zeros_tar_xz(tmp_path / "bomb.tar.xz", ["texts/b.txt", "texts/a.txt"], 60)  # 2 x 3.75 GiB, b first
    assert src.stat().st_size < 2 << 20  # the audit's: 1.2 MB cost 7.5 GiB of temporary disk and 39 s
    proj = on_file(tmp_path, corpus, src, fmt="text")
    params = proj.params
    params["fetch"]["sources"][0]["extract"][0]["include"] = ["texts/*"]
    proj.write_params(params)
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "data/raw/h/bomb.tar.xz expands to over",
            f"more than {archive.MAX_RATIO}x its stored size", "a decompression bomb")
    assert not (proj.root / "data" / "curated").exists()
    ledger_kept(proj, before)


def _reversed_tar_xz(path: Path, rng: random.Random) -> tuple[Path, int]:
    """Documents in reverse path order, after a 150 MB compressible member (over the document cap)
    and 1 MB of noise (not selected), as one xz stream: (path, documents)."""
    docs = {f"texts/d{i:02}.txt": _doc(rng) for i in range(40)}
    big = 150 << 20
    with tarfile.open(path, "w:xz", preset=0) as tf:
        info = tarfile.TarInfo("texts/zz-big.txt")
        info.size = big
        tf.addfile(info, io.BufferedReader(io.BytesIO(b"word " * (big // 5))))  # type: ignore[arg-type]
        noise = tarfile.TarInfo("noise.bin")
        noise.size = 1 << 20
        tf.addfile(noise, io.BytesIO(rng.randbytes(1 << 20)))
        for name in sorted(docs, reverse=True):
            info = tarfile.TarInfo(name)
            info.size = len(docs[name])
            tf.addfile(info, io.BytesIO(docs[name]))
    return path, len(docs)


def test_a_reversed_tar_xz_is_curated_in_path_order_with_a_small_spool(tmp_path: Path, corpus: Path) -> None:
    src, n = _reversed_tar_xz(tmp_path / "rev.tar.xz", random.Random(5))
    spool = tmp_path / "spool"
    spool.mkdir()
    names, spooled = [], 0
    for m in archive.open_members(src, ("texts/*",), (), spool):
        spooled = spooled or sum(p.stat().st_size for p in spool.iterdir())  # all selected members, compressed
        names.append(m.name)
    assert names == sorted(names) and len(names) == n + 1 and not list(spool.iterdir())
    assert spooled < 4 << 20, spooled  # was the whole decompressed tar: 151 MB
    proj = on_file(tmp_path, corpus, src, fmt="text", oversize="drop")
    params = proj.params
    params["fetch"]["sources"][0]["extract"][0]["include"] = ["texts/*"]
    proj.write_params(params)
    before = proj.ledger_files()
    child = run(proj, "-m", "pipeline.curate")
    assert child.code == 0, child.stderr[-2000:]
    bounded(child)
    assert f"kept {n} documents" in child.stdout, child.stdout
    ledger_kept(proj, before)


# -- 11. a run of compressed zeros, or of empty streams -----------------------------------------

def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)  # zeros after ``head``, sparse
    return path


def _empties(path: Path, one: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        block = one * ((1 << 20) // len(one))
        for _ in range(size // len(block)):
            f.write(block)
    return path


def _tar_head() -> bytes:
    return _header("texts/a.txt", 1 << 20) + b"word " * 1000  # a member cut short: no end of archive


@pytest.mark.parametrize("name, make, why", [
    ("zeros.tar.xz", lambda p: _sparse(p, b"", 10 << 30), "no ustar header (Input format not supported"),
    ("after.tar.xz", lambda p: _sparse(p, lzma.compress(_tar_head()), 1 << 30), "not a readable tar archive"),
    ("empties.tar.gz", lambda p: _empties(p, gzip.compress(b""), 256 << 20), "has an empty gzip stream"),
    ("empties.tar.bz2", lambda p: _empties(p, bz2.compress(b""), 256 << 20), "has an empty bzip2 stream"),
    ("empties.tar.xz", lambda p: _empties(p, lzma.compress(b""), 256 << 20), "has an empty xz stream"),
])
def test_pin_refuses_compressed_zeros_and_empty_streams_at_once(tmp_path: Path, project: Project, name: str,
                                                                make, why: str) -> None:
    make(tmp_path / name)
    refused(run(project, "-m", "marin.cli", "--root", str(project.root), "pin", name, cwd=tmp_path), 1,
            name, why)


# ids by suffix: a gzip header holds its mtime, and xdist workers that collect a second apart must agree
@pytest.mark.parametrize("suffix, one", [(".jsonl.gz", gzip.compress(b"", mtime=0)),
                                         (".jsonl.zst", zstandard.ZstdCompressor().compress(b""))],
                         ids=["gz", "zst"])
def test_curate_refuses_a_member_of_empty_streams(tmp_path: Path, corpus: Path, suffix: str, one: bytes) -> None:
    src = _empties(tmp_path / f"empties{suffix}", one, 64 << 20)
    proj = on_file(tmp_path, corpus, src)
    before = proj.ledger_files()
    fmt = "gzip" if suffix.endswith(".gz") else "zstd"
    refused(run(proj, "-m", "pipeline.curate"), 1, f"data/raw/h/{src.name}: member {src.name!r} has an empty "
            f"{fmt} stream with more data after it")
    ledger_kept(proj, before)
    os.unlink(src)
