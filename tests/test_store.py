"""Appends: concurrent writers lose and corrupt nothing; a torn tail is detected and named."""

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest

from marin.errors import LedgerError
from marin.ledger import Recipe, Run, RunFile, read_run
from marin.ledger.check import DvcOuts, check, check_run
from marin.paths import ledger_dir
from tests.conftest import REPO

N = 150
D = "sha256:" + "cd" * 32


def _append_many(path: str, run_id: str, tag: str) -> None:
    f = RunFile(path, run_id)
    for i in range(N):
        f.append("input", {"name": f"{tag}-{i}", "path": "x", "digest": D, "size": i})


def _whole_run(root: str, tag: str) -> None:
    with Run.start(Path(root), Recipe(f"stage-{tag}", {"tag": tag})) as run:
        for i in range(N):
            run.record("input", {"name": f"{tag}-{i}", "path": "x", "digest": D, "size": i})


def test_two_processes_append_to_one_run(tmp_path: Path) -> None:
    run = Run.start(tmp_path, Recipe("concurrent", {}))
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(run.file.path), run.run_id, t)) for t in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    run.finish()
    log = read_run(run.file.path)
    assert log.truncated is None and not log.problems
    names = [r.body["name"] for r in log.of_kind("input")]
    assert sorted(names) == sorted(f"{t}-{i}" for t in "ab" for i in range(N))  # nothing lost
    assert [r.seq for r in log.records] == list(range(2 * N + 2))
    assert check_run(log) == []  # chain and Merkle root valid


def test_two_runs_in_parallel(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_whole_run, args=(str(tmp_path), t)) for t in "xy"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    report = check(tmp_path, DvcOuts({}, {}), 300.0)
    assert report.ok, report.problems
    assert report.runs == 2 and report.records == 2 * (N + 2)


def test_truncated_tail_is_named_and_blocks_appends_until_repaired(tmp_path: Path) -> None:
    with Run.start(tmp_path, Recipe("torn", {})) as run:
        run.record("input", {"name": "a", "path": "x", "digest": D, "size": 1})
    path = run.file.path
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # the run.finished line, cut short

    log = read_run(path)
    assert log.truncated is not None and len(log.records) == 2  # earlier records readable
    problems = check_run(log)
    assert any("truncated last line" in str(p) and path.name in str(p) for p in problems)
    with pytest.raises(LedgerError, match="truncated"):
        run.file.append("input", {"name": "b", "path": "x", "digest": D, "size": 1})

    torn = run.file.repair()
    assert torn is not None and path.with_suffix(".jsonl.torn").read_bytes().startswith(torn)
    assert read_run(path).truncated is None
    run.file.append("input", {"name": "b", "path": "x", "digest": D, "size": 1})
    assert check_run(read_run(path)) == []  # unfinished but valid


def test_bodies_are_the_bodies_of_one_kind_in_file_order(tmp_path: Path) -> None:
    with Run.start(tmp_path, Recipe("typed", {})) as run:
        run.record("input", {"name": "a", "path": "x", "digest": D, "size": 1})
        run.record("metric", {"step": 3, "values": {"loss": {"value": 0.5, "hex": (0.5).hex()}}})
        run.record("input", {"name": "b", "path": "y", "digest": D, "size": 2})
    log = read_run(run.file.path)
    assert [b["name"] for b in log.bodies("input")] == ["a", "b"]
    assert log.bodies("metric") == [{"step": 3, "values": {"loss": {"value": 0.5, "hex": "0x1.0000000000000p-1"}}}]
    assert log.bodies("checkpoint") == []
    assert [len(log.bodies("run.started")), len(log.bodies("run.finished"))] == [1, 1]
    assert log.start_body is log.bodies("run.started")[0] and log.start_body["stage"] == "typed"


@pytest.mark.parametrize("field", ["stage", "params", "code", "env", "recipe_digest", "determinism_class", "seeds"])
def test_each_typed_accessor_is_its_run_started_field(tmp_path: Path, field: str) -> None:
    with Run.start(tmp_path, Recipe("typed", {"train": {"lr": 0.5}})) as run:
        pass
    log = read_run(run.file.path)
    started = json.loads(run.file.path.read_bytes().splitlines()[0])["body"]  # the line itself, not the reader
    assert getattr(log, field) == started[field]
    if field in ("stage", "params"):
        assert getattr(log, field) == {"stage": "typed", "params": {"train": {"lr": 0.5}}}[field]


def test_a_run_without_run_started_is_named_by_each_accessor(tmp_path: Path) -> None:
    f = RunFile(tmp_path / "odd.jsonl", "odd-20261206T000000Z-0123abcd")
    f.append("input", {"name": "a", "path": "x", "digest": D, "size": 1})
    with pytest.raises(LedgerError, match=r"odd\.jsonl: no run\.started record"):
        _ = read_run(tmp_path / "odd.jsonl").stage


def test_failed_stage_records_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Run.start(tmp_path, Recipe("boom", {})) as run:
        raise RuntimeError("disk on fire")
    log = read_run(run.file.path)
    assert log.status == "failed" and "disk on fire" in log.finished.body["error"]
    assert check_run(log) == []
    assert ledger_dir(tmp_path) == run.file.path.parent


FAIL_APPEND = """
import resource, sys
from marin.ledger import RunFile
path, run_id, limit, digest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
RunFile(path, run_id).append("input", {"name": "big", "path": "x" * 2000, "digest": digest, "size": 1})
"""


def test_failed_append_leaves_the_file_byte_identical(tmp_path: Path) -> None:
    """The file may grow only to 100 bytes past its end: the record's write stops short
    there and the next one fails (EFBIG), as on a disk that fills mid-line."""
    run = Run.start(tmp_path, Recipe("full", {}))
    run.record("input", {"name": "a", "path": "x", "digest": D, "size": 1})
    path = run.file.path
    before = path.read_bytes()
    p = subprocess.run([sys.executable, "-c", FAIL_APPEND, str(path), run.run_id, str(len(before) + 100), D],
                       capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})
    assert p.returncode == 1
    assert (f"LedgerError: {path}: cannot append the input record: file too large; nothing was written; "
            "free space (or fix the disk) and rerun the stage") in p.stderr
    assert path.read_bytes() == before  # the partial line was cut off again
    run.finish()  # and the run goes on, its chain intact
    assert check_run(read_run(path)) == []


def test_run_finished_root_is_the_rfc6962_root_of_every_earlier_record_without_rereading(tmp_path: Path) -> None:
    """The appender keeps the Merkle range as it goes; another process's appends are caught up on."""
    from marin.ledger.merkle import merkle_root
    from tests.test_records import EXAMPLES

    path = tmp_path / "ledger" / "runs" / "train-20260101T000000Z-0123abcd.jsonl"
    f = RunFile(path, path.name.removesuffix(".jsonl"))
    f.append("run.started", EXAMPLES["run.started"])
    for i in range(40):
        f.append("metric", {**EXAMPLES["metric"], "step": i + 1})
    other = RunFile(path, f.run_id)  # a second writer (as after a resume), unknown to the first
    for i in range(40, 45):
        other.append("metric", {**EXAMPLES["metric"], "step": i + 1})
    fin = f.append("run.finished", lambda n, root: {**EXAMPLES["run.finished"], "records": n,
                                                     "merkle_root": "sha256:" + root.hex()})
    recs = [json.loads(x) for x in path.read_bytes().splitlines()][:-1]
    assert fin.body["records"] == len(recs) == 46
    assert fin.body["merkle_root"] == "sha256:" + merkle_root([bytes.fromhex(r["digest"][7:]) for r in recs]).hex()
