"""`marin ledger check`: one test per tamper kind; each names the file and the record."""

import json

import rfc8785

from marin.hashing import bytes_digest
from tests.test_records import EXAMPLES


def _run_file(proj, stage: str):
    name = next(n for n in proj.ledger_files() if n.startswith(stage))
    return proj.root / "ledger" / "runs" / name


def _lines(path):
    return path.read_bytes().splitlines(keepends=True)


def _rehash(rec: dict) -> dict:
    rec["digest"] = bytes_digest(rfc8785.dumps({k: v for k, v in rec.items() if k != "digest"}))
    return rec


def test_clean_ledger_passes(data_project) -> None:
    r = data_project.marin("ledger", "check")
    assert r.returncode == 0, r.stderr
    assert "3 runs" in r.stdout and ": ok" in r.stdout


def test_flipped_byte_in_parquet_shard(data_project) -> None:
    shard = sorted((data_project.root / "data" / "tokens").glob("train-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    rel = shard.relative_to(data_project.root).as_posix()
    assert "tokenize-" in r.stderr and "seq" in r.stderr  # names the run file and record
    assert "FAIL data/tokens: on disk" in r.stderr  # the directory output too
    assert f"FAIL {rel}: on disk it hashes to" in r.stderr and "(file changed)" in r.stderr


def test_edited_record(data_project) -> None:
    path = _run_file(data_project, "curate")
    lines = _lines(path)
    rec = json.loads(lines[2])
    rec["body"]["size"] += 1  # an input's size, digest left alone
    lines[2] = rfc8785.dumps(rec) + b"\n"
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} seq 2: record digest mismatch" in r.stderr


def test_edited_record_with_its_digest_recomputed(data_project) -> None:
    path = _run_file(data_project, "curate")
    lines = _lines(path)
    rec = _rehash({**json.loads(lines[1]), "time": "2020-01-01T00:00:00.000000Z"})
    lines[1] = rfc8785.dumps(rec) + b"\n"
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} seq 2: chain broken" in r.stderr


def test_whole_chain_recomputed_still_breaks_merkle_root(data_project) -> None:
    path = _run_file(data_project, "tokenize")
    recs = [json.loads(x) for x in _lines(path)]
    recs[1]["body"]["size"] += 1
    for i, rec in enumerate(recs[:-1]):
        if i:
            rec["prev"] = recs[i - 1]["digest"]
        _rehash(rec)
    recs[-1]["prev"] = recs[-2]["digest"]
    _rehash(recs[-1])
    path.write_bytes(b"".join(rfc8785.dumps(r) + b"\n" for r in recs))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} seq {recs[-1]['seq']}: Merkle root mismatch" in r.stderr


def test_deleted_line(data_project) -> None:
    path = _run_file(data_project, "fetch")
    lines = _lines(path)
    del lines[1]
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} seq 2: seq 2 where 1 was expected" in r.stderr
    assert "chain broken" in r.stderr


def test_truncated_last_line(data_project) -> None:
    path = _run_file(data_project, "curate")
    data = path.read_bytes()
    path.write_bytes(data[:-25])
    n = len(_lines(path))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} line {n}: truncated last line" in r.stderr
    log = data_project.marin("ledger", "log")
    assert "unfinished (truncated)" in log.stdout  # earlier records still readable


def test_garbage_line_is_named(data_project) -> None:
    path = _run_file(data_project, "fetch")
    lines = _lines(path)
    lines.insert(2, b'{"not": "a record"}\n')
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} line 3:" in r.stderr


def _finished_run(path, verification_first: bool = False):
    """A minimal run file written through the ledger's own appender."""
    from marin import hashing
    from marin.ledger.store import RunFile
    f = RunFile(path, path.name.removesuffix(".jsonl"))
    f.append("run.started", EXAMPLES["run.started"])
    if verification_first:
        f.append("verification", EXAMPLES["verification"])
    f.append("run.finished", lambda n, root: {**EXAMPLES["run.finished"], "records": n, "merkle_root":
                                              hashing.fmt(root)})
    return f


def test_verification_records_may_follow_run_finished(tmp_path) -> None:
    from marin.ledger.check import check_run
    from marin.ledger.store import read_run

    path = tmp_path / "train-20260101T000000Z-0123abcd.jsonl"
    f = _finished_run(path)
    f.append("verification", EXAMPLES["verification"])
    f.append("verification", EXAMPLES["verification"])
    log = read_run(path)
    assert check_run(log) == [] and log.status == "succeeded" and log.finished.seq == 1


def test_a_verification_before_run_finished_is_named(tmp_path) -> None:
    from marin.ledger.check import check_run
    from marin.ledger.store import read_run

    path = tmp_path / "train-20260101T000000Z-0123abcd.jsonl"
    _finished_run(path, verification_first=True)
    problems = [str(p) for p in check_run(read_run(path))]
    assert problems == [f"{path.name} seq 1: a verification record before run.finished"]


def test_a_locked_output_missing_without_dvc_yaml_is_reported_not_a_crash(data_project) -> None:
    import shutil

    import yaml

    proj = data_project
    curate = next(json.loads(x) for x in _lines(_run_file(proj, "curate"))
                  if json.loads(x)["kind"] == "output" and json.loads(x)["body"]["path"] == "data/curated")
    (proj.root / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"curate": {"outs": [
        {"path": "data/curated", "md5": curate["body"]["dvc_md5"]}]}}}))
    (proj.root / "dvc.yaml").unlink()
    shutil.rmtree(proj.root / "data" / "curated")
    r = proj.marin("ledger", "check")
    assert "Traceback" not in r.stderr, r.stderr
    assert "data/curated: recorded by curate-" in r.stdout + r.stderr
