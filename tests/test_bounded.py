"""Bounded work for every input: hostile inputs (decompression bombs, giant records, an empty
corpus, too little data, an oversized pretrained tokenizer, silent servers, files that lie about
their type) are refused, or dropped where a param says so, in one line, in seconds and in
bounded memory. Each command runs as a real subprocess measured by tests/proc.py (its own peak
RSS from ``os.wait4``, its CPU time: its cost whatever else the machine runs) under an
address-space cap (RLIMIT_AS), so a regression fails the test instead of exhausting the
machine; the ledger stays valid and keeps every earlier record.
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

CPU_S = 10.0  # the command's own CPU (and its reaped workers'): what it costs, whatever else the machine runs
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
    print(f"line: {lines[0]}")
    return lines[0]


def bounded(child: proc.Child) -> None:
    print(f"measured: exit {child.code}, {child.cpu_s:.2f} CPU s ({child.wall_s:.2f} s wall), "
          f"peak RSS {child.rss_kib >> 10} MB")  # -s shows it
    assert child.cpu_s < CPU_S, f"took {child.cpu_s:.1f} CPU s ({child.wall_s:.1f} s wall)"
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

def curated_dropping(proj: Project) -> tuple[dict, dict]:
    """Curate in a bounded child that must succeed: its manifest and the funnel's oversize step."""
    child = run(proj, "-m", "pipeline.curate")
    assert child.code == 0, child.stderr
    bounded(child)
    m = json.loads((proj.root / "data/curated/manifest.json").read_text())
    return m, next(s for s in m["funnel"]["steps"] if s["step"] == "oversize")


def test_a_giant_record_is_dropped_and_counted_in_bounded_memory(tmp_path: Path, corpus: Path) -> None:
    giant = 200 << 20  # 200 MB of one JSON line (the audit's case: 3.7 GB of RSS before)
    src = gzip_stream(tmp_path / "giant.jsonl.gz", [
        records(20), b'{"text": "', *repeat(b"word " * (1 << 18), giant), b'"}\n', records(20, seed=4)])
    proj = on_file(tmp_path, corpus, src, oversize="drop")
    before = proj.ledger_files()
    m, step = curated_dropping(proj)
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


# -- 3. an empty corpus, too little data for the params ----------------------------------------

def test_an_empty_jsonl_is_refused_by_curate_in_one_line(tmp_path: Path, corpus: Path) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_bytes(b"")
    proj = on_file(tmp_path, corpus, src)
    before = proj.ledger_files()
    line = refused(run(proj, "-m", "pipeline.curate"), 1, "curate: no document is left for the train split",
                   "(0 document(s) in; no step removed any; 0 in validation)", "add data")
    assert "Traceback" not in line and not (proj.root / "data" / "curated").exists()
    ledger_kept(proj, before)


def test_tokenize_refuses_an_empty_curated_train_split_before_it_starts(data_project: Project) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin.data.curate import SCHEMA

    path = data_project.root / "data/curated/train.parquet"
    kept = path.read_bytes()
    pq.write_table(pa.table({f.name: pa.array([], f.type) for f in SCHEMA}), path)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.tokenize"), 1,
            "data/curated/train.parquet: the train split has no document")
    assert data_project.ledger_files() == before  # refused before any run started
    path.write_bytes(kept)  # the ledger check would name the edited output
    ledger_kept(data_project, before)


def test_train_refuses_an_empty_validation_split_before_it_starts(project: Project) -> None:
    params = project.params
    params["curate"]["split"]["validation_fraction"] = 1e-9  # every document goes to train
    project.write_params(params)
    for stage in ("fetch", "curate", "tokenize"):
        project.stage(stage)
    before = project.ledger_files()
    refused(run(project, "-m", "pipeline.train"), 1, "data/tokens: the validation split has no tokens",
            "curate.split.validation_fraction")
    assert project.ledger_files() == before
    ledger_kept(project, before)


def test_train_refuses_fewer_tokens_than_one_batch_before_it_starts(data_project: Project) -> None:
    params = data_project.params
    params["train"]["batch_size"] = 4096
    data_project.write_params(params)
    before = data_project.ledger_files()
    tokens = json.loads((data_project.root / "data/tokens/manifest.json").read_text())["splits"]["train"]["tokens"]
    line = refused(run(data_project, "-m", "pipeline.train"), 1,
                   f"the train split has {tokens:,} tokens", "fewer than one batch of sequences",
                   "train.batch_size 4096 x model.seq_len 128 = 524,288")
    assert data_project.ledger_files() == before, line
    ledger_kept(data_project, before)


# -- 4. a pretrained tokenizer: bounded before it is parsed --------------------------------------

def _pretrained(proj: Project, data: bytes) -> None:
    (proj.root / "tokenizer" / "big.json").write_bytes(data)
    params = proj.params
    params["tokenize"]["pretrained"] = {"path": "tokenizer/big.json", "sha256": hashlib.sha256(data).hexdigest()}
    proj.write_params(params)


@pytest.mark.parametrize("case", ["size", "entries"])
def test_a_huge_pretrained_tokenizer_is_refused_before_parsing(data_project: Project, case: str) -> None:
    if case == "size":  # 40 MB: over the size bound, refused unread
        data, words = b" " * (40 << 20), ("is over 32 MiB", "refused unread")
    else:  # 10 MB with 2.6 M entries (the audit's 188 MB file had 10 M): refused before parsing
        entries = b",".join(b'"t%d": %d' % (i, i) for i in range(600_000))
        data = b'{"model": {"vocab": {' + entries + b"}}}"
        words = ("JSON entries", "refused before parsing")
    _pretrained(data_project, data)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.tokenize"), 1, "tokenize.pretrained.path: tokenizer/big.json", *words)
    assert data_project.ledger_files() == before
    ledger_kept(data_project, before)


# -- 6. what a file is: from its name, checked against its bytes; special files refused -----------

def test_pin_refuses_zeros_named_tar_and_pins_zeros_named_bin_as_one_file(tmp_path: Path, project: Project) -> None:
    for name, size in (("zeros.tar", 1 << 30), ("zeros.tar.gz", 1 << 30), ("zeros.bin", 256 << 20)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)  # zeros, sparse (the audit: 1 GiB took 117 s and pinned "0 files" as a tar)
    for name in ("zeros.tar", "zeros.tar.gz"):
        refused(run(project, "-m", "marin.cli", "--root", str(project.root), "pin", name, cwd=tmp_path), 1,
                f"{name}: named like a tar archive but its first block has no ustar header")
    child = run(project, "-m", "marin.cli", "--root", str(project.root), "pin", "zeros.bin", cwd=tmp_path)
    assert child.code == 0 and "(1 file, 268435456 bytes)" in child.stdout, child.stderr
    bounded(child)


@pytest.mark.parametrize("target, why", [("/proc/self/environ", "is a kernel pseudo-file"),
                                         ("/proc/self", "is a kernel pseudo-file"),
                                         ("fifo.jsonl", "is a fifo"), ("/dev/zero", "is a character device")])
def test_pin_refuses_special_files_without_reading_them(tmp_path: Path, project: Project, target: str,
                                                        why: str) -> None:
    os.mkfifo(tmp_path / "fifo.jsonl")  # opening it would block forever
    refused(run(project, "-m", "marin.cli", "--root", str(project.root), "pin", target, cwd=tmp_path), 1, why,
            "refusing")


def test_archive_kind_is_the_name_checked_against_the_bytes(tmp_path: Path) -> None:
    import tarfile
    import zipfile

    from marin.data import archive
    from marin.errors import StageError

    good = tmp_path / "a.tar.gz"
    with tarfile.open(good, "w:gz") as tf:
        tf.add(__file__, arcname="t.py")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
        zf.writestr("t.txt", "x")
    (tmp_path / "tar-named.zip").write_bytes(good.read_bytes())
    (tmp_path / "plain.jsonl").write_bytes(good.read_bytes())  # a tar's bytes under a plain name: one file
    assert [archive.kind(tmp_path / n) for n in ("a.tar.gz", "a.zip", "plain.jsonl", ".")] == \
        ["tar", "zip", "file", "dir"]
    with pytest.raises(StageError, match=r"tar-named\.zip: named \.zip but does not start with a zip signature"):
        archive.kind(tmp_path / "tar-named.zip")


# -- 5. silent servers: every network operation bounded, one line naming the URL ------------------

NETWORK = {"connect_timeout_s": 1, "read_timeout_s": 1, "retries": 1}


def _bounded_network(proj: Project) -> None:
    params = proj.params
    params["network"] = dict(NETWORK)
    proj.write_params(params)


def test_pin_of_a_url_on_a_silent_server_gives_up_in_one_line(project: Project) -> None:
    from tests.servers import Silent

    _bounded_network(project)
    with Silent() as server:
        url = f"{server.url}/corpus.tar.gz"
        refused(run(project, "-m", "marin.cli", "--root", str(project.root), "pin", url), 1, f"{url}: no answer (",
                "read timeout 1 s, 2 tries (network.* in params.yaml)")
        assert len(server.held) == 2  # it connected, waited, and tried once more


def test_fetch_of_a_url_source_on_a_silent_server_fails_its_run_in_one_line(project: Project) -> None:
    from tests.servers import Silent

    _bounded_network(project)
    project.stage("fetch")
    before = project.ledger_files()
    raw = project.tree("data/raw")
    with Silent() as server:
        url = f"{server.url}/mini.tar.gz"
        params = project.params
        params["fetch"]["sources"][0].update(kind="url", locator=url, sha256="1" * 64)  # nothing cached matches
        project.write_params(params)
        refused(run(project, "-m", "pipeline.fetch"), 1, "fetch.sources[mini]: cannot download", f"{url}: no answer")
    assert project.runs("fetch")[-1][-1]["body"]["status"] == "failed"  # finished, not left unfinished
    assert project.tree("data/raw") == raw
    ledger_kept(project, before)


def test_publish_to_a_silent_s3_remote_gives_up_in_one_line(project: Project) -> None:
    from tests.servers import S3_ENV, Silent

    _bounded_network(project)
    project.env.update(S3_ENV)
    with Silent() as server:
        project.dvc("remote", "add", "-d", "lab", "s3://bucket/dvc")
        project.dvc("remote", "modify", "lab", "endpointurl", server.url)
        before = project.ledger_files()
        refused(run(project, "-m", "marin.cli", "publish"), 1,
                f"DVC remote lab: s3://bucket/dvc (endpoint {server.url}) did not answer", "read timeout 1 s")
    ledger_kept(project, before)


# -- the pieces: line_chunks, Parquet values and groups over the cap -----------------------------

@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_line_chunks_skip_a_line_over_the_cap_unread_and_keep_counting_lines(end: bytes) -> None:
    import io

    from marin.data.shards import Oversize, line_chunks

    data = b"a1" + end + b"b2" + end + b"x" * 1000 + end + b"c4" + end + b"d5" + end
    seen: list[tuple[int, int]] = []

    def over(line: int, n: int) -> Oversize:
        seen.append((line, n))
        return Oversize(n)

    got = list(line_chunks(io.BytesIO(data), size=16, cap=100, over=over))
    assert [(n, c) for n, c in got if isinstance(c, Oversize)] == [(3, Oversize(1000))]
    assert len(seen) == 1 and 100 < seen[0][1] <= 100 + 16  # held at most cap + one block
    assert b"".join(c for _, c in got if isinstance(c, bytes)) == b"a1" + end + b"b2" + end + b"c4" + end + b"d5" + end
    first_after = next(n for n, c in got if isinstance(c, bytes) and c.startswith(b"c4"))
    assert first_after == 4


def test_parquet_values_and_groups_over_the_cap_are_dropped_and_counted(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin import config
    from tests.test_curate_scale import run_curate

    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    texts = [" ".join(rng.choice(WORDS) for _ in range(80)) for _ in range(12)]
    texts[3] = "big " * 2000  # 8,000 bytes: over a 2,048-byte cap
    pq.write_table(pa.table({"text": texts, "chapter": [i // 3 for i in range(12)]}), src / "t.parquet")
    (src / "g.jsonl").write_bytes(b"".join(json.dumps({"text": t, "ch": 0 if i < 6 else 1}).encode() + b"\n"
                                           for i, t in enumerate(texts[4:])))  # group 0: 6 x ~400 bytes
    p = mini_params(src)
    p["fetch"]["sources"][0]["extract"] = [
        {"corpus": "rows", "include": ["t.parquet"], "format": "parquet", "text_field": "text"},
        {"corpus": "groups", "include": ["g.jsonl"], "format": "jsonl", "text_field": "text", "group_by": ["ch"]}]
    p["curate"].update(max_document_bytes=2048, oversize="drop")
    p["curate"]["filters"]["min_words"] = 1
    run_curate(config.parse(p), src, tmp_path / "out")
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    over = sorted(r["name"] for r in m["removed"] if r["step"] == "oversize")
    assert over == ["g.jsonl#0", "t.parquet#4"]
    assert m["funnel"]["corpora"]["rows"]["removed"]["oversize"] == {"docs": 1, "bytes": 8000}
    p["curate"]["oversize"] = "refuse"
    from marin.errors import StageError

    with pytest.raises(StageError, match=r"member 't\.parquet' row 4: a record or document of 8,000 bytes"):
        run_curate(config.parse(p), src, tmp_path / "out2")
