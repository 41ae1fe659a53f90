"""The ledger head's ``since``: what a snapshot proves about the runs it names, first as a pure
function, then over run files written by the ledger's appender and read back by ``locate``."""

from __future__ import annotations

from pathlib import Path

from marin.ledger.head import Head, Leaf, locate, root_of, since
from marin.ledger.store import RunFile
from tests.test_records import EXAMPLES

A, B = "curate-20260101T000000Z-0000000a", "train-20260101T000000Z-0000000b"
DA, DB, DX = ("sha256:" + c * 64 for c in "abc")


def snapshot(*leaves: Leaf) -> Head:
    ordered = tuple(sorted(leaves, key=lambda x: x.run_id))
    return Head(root_of(ordered), ordered)


SNAP = snapshot(Leaf(A, 3, DA), Leaf(B, 7, DB))


def test_runs_unchanged_or_extended_and_new_runs_pass() -> None:
    assert since(SNAP, {A: (3, DA), B: (7, DB)}) == []
    assert since(SNAP, {A: (9, DA), B: (8, DB), "new-20260102T000000Z-0000000c": (0, None)}) == []


def test_a_deleted_run_file_is_named() -> None:
    [(name, why)] = since(SNAP, {B: (7, DB)})
    assert name == f"{A}.jsonl"
    assert why == (f"in the snapshot {SNAP.root[:19]}… (seq 3) but the run file is gone: was it deleted? "
                   "restore it from git (`git checkout -- ledger/runs/`)")


def test_a_rolled_back_tail_is_named() -> None:
    assert since(SNAP, {A: (3, DA), B: (5, None)}) == [
        (f"{B}.jsonl", "the snapshot has seq 7, the file ends at seq 5: records were removed (rolled back)")]


def test_a_rewritten_record_is_named_with_both_digests() -> None:
    assert since(SNAP, {A: (4, DX), B: (7, DB)}) == [
        (f"{A}.jsonl seq 3", f"is now {DX}, the snapshot has {DA}: the history was rewritten")]


def test_every_change_is_named_in_snapshot_order() -> None:
    got = since(SNAP, {A: (2, None)})
    assert [name for name, _ in got] == [f"{A}.jsonl", f"{B}.jsonl"]


def test_locate_then_since_over_real_run_files(tmp_path: Path) -> None:
    f = RunFile(tmp_path / f"{A}.jsonl", A)
    f.append("run.started", EXAMPLES["run.started"])
    last = f.append("input", EXAMPLES["input"])
    snap = snapshot(Leaf(A, last.seq, last.digest))
    assert since(snap, locate(tmp_path, snap)) == []

    f.append("output", EXAMPLES["output"])  # history grows
    assert locate(tmp_path, snap) == {A: (2, last.digest)} and since(snap, locate(tmp_path, snap)) == []

    lines = f.path.read_bytes().splitlines(keepends=True)
    f.path.write_bytes(b"".join(lines[:1]))  # rolled back to the first record
    assert since(snap, locate(tmp_path, snap)) == [
        (f"{A}.jsonl", "the snapshot has seq 1, the file ends at seq 0: records were removed (rolled back)")]

    f.path.unlink()
    assert locate(tmp_path, snap) == {} and "the run file is gone" in since(snap, {})[0][1]
