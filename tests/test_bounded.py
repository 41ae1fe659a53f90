"""Bounded work for every input: hostile inputs (decompression bombs, giant records, an empty
corpus, too little data, an oversized pretrained tokenizer, silent servers, files that lie about
their type) are refused, or dropped where a param says so, in one line, in seconds and in
bounded memory. Each command runs as a real subprocess measured by tests/proc.py (its own peak
RSS from ``os.wait4``, its wall time) under an address-space cap (RLIMIT_AS), so a regression
fails the test instead of exhausting the machine; the ledger stays valid and keeps every
earlier record.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import zlib
from pathlib import Path

import pytest

from tests import proc
from tests.conftest import BIN, WORDS, Project, env_for_subprocess, mini_params, new_project

WALL_S = 10.0
RSS_KIB = 500 * 1024
AS_LIMIT = 3 << 30  # address space: the data stages need ~1.3 GB of it (pyarrow, tokenizers); JAX is not imported


def run(proj: Project, *argv: str, cwd: Path | None = None) -> proc.Child:
    """``python argv`` in the project, measured and capped."""
    return proc.measure(cwd or proj.root, str(BIN / "python"), *argv, env={**env_for_subprocess(), **proj.env},
                        timeout=120, as_limit=AS_LIMIT, cpu_limit_s=60)


def refused(child: proc.Child, code: int, *words: str) -> str:
    """The one line of a refusal, after checking exit code, time and memory."""
    lines = [x for x in child.stderr.splitlines() if x.strip()]
    assert child.code == code, (child.code, child.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("marin: error: "), child.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    bounded(child)
    return lines[0]


def bounded(child: proc.Child) -> None:
    print(f"measured: exit {child.code}, {child.wall_s:.2f} s, peak RSS {child.rss_kib >> 10} MB")  # -s shows it
    assert child.wall_s < WALL_S, f"took {child.wall_s:.1f} s"
    assert child.rss_kib < RSS_KIB, f"peak RSS {child.rss_kib >> 10} MB"


def ledger_kept(proj: Project, before: dict[str, bytes]) -> None:
    """Every earlier run file is byte for byte as it was, and the ledger checks."""
    after = proj.ledger_files()
    assert all(after.get(name) == data for name, data in before.items())
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stdout + check.stderr


# -- hostile files, made cheaply ------------------------------------------------------------

def gzip_stream(path: Path, pieces) -> Path:
    """A .gz file written piece by piece: the uncompressed bytes are never held."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip header
    with open(path, "wb") as f:
        for piece in pieces:
            f.write(z.compress(piece))
        f.write(z.flush())
    return path


def repeat(chunk: bytes, total: int):
    for _ in range(total // len(chunk)):
        yield chunk


def records(n: int, seed: int = 3) -> bytes:
    """``n`` JSON lines of ~80 plain words each: documents the filters keep."""
    rng = random.Random(seed)
    return b"".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(80)) + "."}).encode() + b"\n"
                    for _ in range(n))


def on_file(tmp_path: Path, corpus: Path, path: Path, fmt: str = "jsonl", **curate: object) -> Project:
    """A project whose one source is the file ``path`` (kind ``file``), fetched."""
    params = mini_params(corpus)
    params["fetch"]["sources"] = [{
        "name": "h", "kind": "file", "locator": str(path), "license": "CC0-1.0",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "extract": [{"corpus": "h", "include": [path.name], "format": fmt,
                     **({"text_field": "text"} if fmt != "text" else {})}],
    }]
    params["curate"].update(curate)
    proj = new_project(tmp_path / "proj", params)
    proj.stage("fetch")
    return proj


# -- 1. a decompression bomb: one unterminated record ------------------------------------------

@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_decompression_bomb_of_one_unterminated_record_is_refused_in_seconds(tmp_path: Path, corpus: Path,
                                                                                suffix: str) -> None:
    src = tmp_path / f"bomb{suffix}"
    if suffix == ".jsonl.gz":
        member = gzip.compress(b"a" * (1 << 20), 9)  # concatenated members are one stream
        head = gzip.compress(b'{"text": "', 9)
    else:
        import zstandard

        member = zstandard.ZstdCompressor(level=19).compress(b"a" * (1 << 20))  # frames: read across
        head = zstandard.ZstdCompressor().compress(b'{"text": "')
    with open(src, "wb") as f:  # 4 GiB of 'a' after an opening quote: the old guard allowed 800 MB and 15 s
        f.write(head + member * 4096)
    assert src.stat().st_size < 8 << 20
    proj = on_file(tmp_path, corpus, src)
    before = proj.ledger_files()
    child = run(proj, "-m", "pipeline.curate")
    refused(child, 1, f"data/raw/h/{src.name}: member '{src.name}' line 1:",
            "over the 16,777,216-byte cap (curate.max_document_bytes)", "curate.oversize: drop")
    assert not (proj.root / "data" / "curated").exists()
    assert proj.runs("curate")[-1][-1]["body"]["status"] == "failed"
    ledger_kept(proj, before)


# -- 2. one giant record: memory bounded by the cap, dropped and counted, or refused -----------

def test_a_giant_record_is_dropped_and_counted_in_bounded_memory(tmp_path: Path, corpus: Path) -> None:
    giant = 200 << 20  # 200 MB of one JSON line (the audit's case: 3.7 GB of RSS before)
    src = gzip_stream(tmp_path / "giant.jsonl.gz", [
        records(20), b'{"text": "', *repeat(b"word " * (1 << 18), giant), b'"}\n', records(20, seed=4)])
    proj = on_file(tmp_path, corpus, src, oversize="drop")
    before = proj.ledger_files()
    child = run(proj, "-m", "pipeline.curate")
    assert child.code == 0, child.stderr
    bounded(child)
    m = json.loads((proj.root / "data/curated/manifest.json").read_text())
    step = next(s for s in m["funnel"]["steps"] if s["step"] == "oversize")
    assert step["removed"]["docs"] == 1 and step["removed"]["bytes"] >= giant  # counted, never held
    assert [r["name"] for r in m["removed"] if r["step"] == "oversize"] == ["giant.jsonl.gz#21"]
    assert m["splits"]["train"]["docs"] + m["splits"]["validation"]["docs"] == 40
    ledger_kept(proj, before)


def test_a_giant_text_member_is_refused_before_it_is_read(tmp_path: Path, corpus: Path) -> None:
    src = tmp_path / "huge.txt"
    src.write_bytes(b"word " * (4 << 20))  # 20 MB, over a 1 MiB cap: its size alone refuses it
    proj = on_file(tmp_path, corpus, src, fmt="text", max_document_bytes=1 << 20)
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "data/raw/h/huge.txt: member 'huge.txt': a record or document of "
            "20,971,520 bytes or more, over the 1,048,576-byte cap")
    ledger_kept(proj, before)
