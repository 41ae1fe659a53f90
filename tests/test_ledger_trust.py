"""Ways to make the ledger say something false, each caught and named (issue 10, items 1-3).

Rollback (a deleted run file leaves outputs unexplained), a snapshot that proves history
only grew (`marin ledger head`, `ledger check --since`), and lines that are not exactly
the bytes that were hashed (duplicate keys, re-serialized lines).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import rfc8785

from marin.hashing import bytes_digest
from tests.conftest import Project


def run_file(proj: Project, stage: str) -> Path:
    return sorted((proj.root / "ledger" / "runs").glob(f"{stage}-*.jsonl"))[-1]


def rehash(rec: dict) -> dict:
    rec["digest"] = bytes_digest(rfc8785.dumps({k: v for k, v in rec.items() if k != "digest"}))
    return rec


# -- 1. rollback --------------------------------------------------------------------------

def test_a_deleted_evaluate_run_leaves_its_output_unexplained(trained_project: Project) -> None:
    assert trained_project.marin("ledger", "check").returncode == 0
    run_file(trained_project, "evaluate").unlink()
    r = trained_project.marin("ledger", "check")
    assert r.returncode == 1
    assert "FAIL metrics/eval.json: on disk but no run in the ledger produced it: was a run file deleted?" in r.stderr


def test_a_deleted_train_run_leaves_the_model_unexplained(trained_project: Project) -> None:
    run_file(trained_project, "train").unlink()
    r = trained_project.marin("ledger", "check")
    assert r.returncode == 1
    for path in ("models/final", "metrics/train_curve.csv"):
        assert f"FAIL {path}: on disk but no run in the ledger produced it" in r.stderr


def test_a_recorded_output_missing_from_disk_is_reported(trained_project: Project) -> None:
    shutil.rmtree(trained_project.root / "models" / "final")
    r = trained_project.marin("ledger", "check")
    assert r.returncode == 0 and "1 recorded outputs not on disk" in r.stdout
    assert "MISSING models/final: recorded by train-" in r.stderr and "dvc checkout" in r.stderr
    strict = trained_project.marin("ledger", "check", "--require-outputs")
    assert strict.returncode == 1 and "FAIL models/final: recorded by train-" in strict.stderr
    (trained_project.root / "metrics" / "eval.json").unlink()  # `cache: false` in dvc.yaml: git keeps it, not DVC
    r = trained_project.marin("ledger", "check")
    [line] = [x for x in r.stderr.splitlines() if x.startswith("MISSING metrics/eval.json")]
    assert "out of the DVC cache: commit it with git" in line and "dvc checkout" not in line, line


# -- 2. the ledger head and --since -------------------------------------------------------

def independent_root(runs: Path) -> tuple[str, int]:
    """RFC 6962 MTH over (run id, last seq, last digest) of each run, sorted by run id, computed here."""
    leaves = []
    for path in sorted(runs.glob("*.jsonl"), key=lambda p: p.name.removesuffix(".jsonl")):
        last = json.loads(path.read_bytes().splitlines()[-1])
        leaves.append(rfc8785.dumps({"run_id": last["run_id"], "seq": last["seq"], "digest": last["digest"]}))

    def mth(d: list[bytes]) -> bytes:
        if not d:
            return hashlib.sha256(b"").digest()
        if len(d) == 1:
            return hashlib.sha256(b"\x00" + d[0]).digest()
        k = 1
        while k * 2 < len(d):
            k *= 2
        return hashlib.sha256(b"\x01" + mth(d[:k]) + mth(d[k:])).digest()

    return "sha256:" + mth(leaves).hex(), len(leaves)


def snapshot(proj: Project, dest: Path) -> dict:
    r = proj.marin("ledger", "head", "--json", check=True)
    dest.write_text(r.stdout)
    return json.loads(r.stdout)


def test_ledger_head_is_the_rfc6962_root_over_every_run(data_project: Project) -> None:
    root, n = independent_root(data_project.root / "ledger" / "runs")
    r = data_project.marin("ledger", "head", check=True)
    assert r.stdout.strip() == f"{root} {n} runs" and n == 3


def test_since_accepts_growth_and_names_deletion_rollback_and_rewrite(data_project: Project, tmp_path: Path) -> None:
    snap = tmp_path / "head.json"
    snapshot(data_project, snap)
    data_project.stage("tokenize")  # a new run: history grew
    ok = data_project.marin("ledger", "check", "--since", str(snap))
    assert ok.returncode == 0, ok.stderr
    assert "every run of snapshot" in ok.stdout and "intact or extended" in ok.stdout

    fetch, curate = run_file(data_project, "fetch"), run_file(data_project, "curate")
    fetch.unlink()
    lines = curate.read_bytes().splitlines(keepends=True)
    curate.write_bytes(b"".join(lines[:-1]))  # rolled back: run.finished removed, chain still valid
    r = data_project.marin("ledger", "check", "--since", str(snap))
    assert r.returncode == 1
    assert f"FAIL {fetch.name}: in the snapshot" in r.stderr and "the run file is gone: was it deleted?" in r.stderr
    assert f"FAIL {curate.name}: the snapshot has seq {len(lines) - 1}" in r.stderr and "rolled back" in r.stderr


def test_a_fully_consistent_rewrite_passes_check_but_not_since(data_project: Project, tmp_path: Path) -> None:
    snap = tmp_path / "head.json"
    snapshot(data_project, snap)
    path = run_file(data_project, "curate")
    recs = [json.loads(x) for x in path.read_bytes().splitlines()]
    t = recs[0]["time"]
    recs[0]["time"] = t[:-2] + ("2" if t[-2] == "1" else "1") + "Z"  # moved 1 µs or so, within the clock skew;
    # every digest, link and the Merkle root recomputed
    for i, rec in enumerate(recs):
        rec["prev"] = recs[i - 1]["digest"] if i else None
        if rec["kind"] == "run.finished":
            from marin.ledger.merkle import merkle_root
            rec["body"]["merkle_root"] = "sha256:" + merkle_root(
                [bytes.fromhex(x["digest"][7:]) for x in recs[:i]]).hex()
        rehash(rec)
    path.write_bytes(b"".join(rfc8785.dumps(r) + b"\n" for r in recs))
    assert data_project.marin("ledger", "check").returncode == 0  # consistent: the check alone cannot tell
    r = data_project.marin("ledger", "check", "--since", str(snap))
    assert r.returncode == 1
    assert f"FAIL {path.name} seq {len(recs) - 1}: is now {recs[-1]['digest']}" in r.stderr
    assert "the history was rewritten" in r.stderr


def test_an_edited_snapshot_is_refused(data_project: Project, tmp_path: Path) -> None:
    snap = tmp_path / "head.json"
    doc = snapshot(data_project, snap)
    doc["leaves"] = doc["leaves"][1:]  # drop a run from the snapshot, keep its root
    doc["runs"] -= 1
    snap.write_text(json.dumps(doc))
    r = data_project.marin("ledger", "check", "--since", str(snap))
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert f"{snap}: the snapshot's leaves hash to" in r.stderr and "(the snapshot was edited)" in r.stderr


# -- 3. lines are exactly what was hashed ---------------------------------------------------

def test_a_duplicate_body_key_is_refused(data_project: Project) -> None:
    path = run_file(data_project, "curate")
    lines = path.read_bytes().splitlines(keepends=True)
    honest = json.loads(lines[1])
    forged = {**honest["body"], "digest": "sha256:" + "0" * 64}
    # Python keeps the last "body" (honest, so the digest matches); another reader sees the first.
    lines[1] = lines[1].replace(b'"body":', b'"body":' + rfc8785.dumps(forged) + b',"body":', 1)
    assert json.loads(lines[1]) == honest
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} line 2 (seq 1): duplicate key 'body'" in r.stderr


def test_a_reserialized_line_is_refused(data_project: Project) -> None:
    path = run_file(data_project, "fetch")
    lines = path.read_bytes().splitlines(keepends=True)
    rec = json.loads(lines[2])
    lines[2] = json.dumps(rec, sort_keys=True).encode() + b"\n"  # the same record, other bytes
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1
    assert f"FAIL {path.name} line 3 (seq 2): the line is not in RFC 8785 canonical form" in r.stderr


def test_non_finite_numbers_in_a_line_are_refused(data_project: Project) -> None:
    path = run_file(data_project, "fetch")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"size":', b'"size":NaN,"x":', 1)
    path.write_bytes(b"".join(lines))
    r = data_project.marin("ledger", "check")
    assert r.returncode == 1 and f"FAIL {path.name} line 3 (seq 2): NaN is not a JSON number" in r.stderr
