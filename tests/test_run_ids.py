"""Short run ids (issue 57): a unique prefix of a run id, or its 8-hex tail as MLflow's run names show it
(``train 1a2b3c4d``), is accepted wherever a run id is taken (marin.ledger.store.resolve_run_id: diff,
verify, lineage, report --model, ledger repair); an ambiguous one is refused in one line listing the runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin import hashing
from marin.commands.diff import diff
from marin.ledger.index import Index
from marin.ledger.query import AmbiguousTarget, Ledger, Target
from marin.ledger.store import AmbiguousRun, NoSuchRun, RunFile, resolve_run_id
from marin.paths import ledger_dir
from marin.stages import SOURCE_STAGES
from marin.verify import CannotVerify, verify
from tests.test_records import EXAMPLES

TRAIN_A, TRAIN_B = "train-20260101T000000Z-1a2b3c4d", "train-20260102T000000Z-5e6f7a8b"
CURATE = "curate-20260101T000000Z-c0ffee00"


def _run(root: Path, run_id: str, status: str = "succeeded") -> None:
    f = RunFile(ledger_dir(root) / f"{run_id}.jsonl", run_id)
    f.append("run.started", {**EXAMPLES["run.started"], "stage": run_id.split("-")[0]})
    f.append("run.finished", lambda n, r: {**EXAMPLES["run.finished"], "status": status, "records": n,
                                           "merkle_root": hashing.fmt(r)})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ledger_dir(tmp_path).mkdir(parents=True)
    (tmp_path / "params.yaml").write_text("{}\n")  # a project, for the CLI
    for run_id, status in ((TRAIN_A, "succeeded"), (TRAIN_B, "failed"), (CURATE, "succeeded")):
        _run(tmp_path, run_id, status)
    return tmp_path


@pytest.mark.parametrize(("given", "expected"), [
    (TRAIN_A, TRAIN_A),                 # a whole id is itself
    ("1a2b3c4d", TRAIN_A),              # the 8-hex tail MLflow shows
    ("c0ffee00", CURATE),
    ("train-20260102", TRAIN_B),        # a unique prefix
    ("curate", CURATE),
])
def test_a_short_run_id_names_its_run(root: Path, given: str, expected: str) -> None:
    assert resolve_run_id(root, given) == expected


@pytest.mark.parametrize("given", ["1a2b", "3c4d", "nope", "train-2099", "../runs/x", "", "a b"])
def test_a_run_id_that_names_no_run_is_refused(root: Path, given: str) -> None:
    with pytest.raises(NoSuchRun, match=r"no such run in .*; see `marin ledger log`") as e:
        resolve_run_id(root, given)
    assert not isinstance(e.value, AmbiguousRun)


@pytest.mark.parametrize("given", ["train", "train-2026", "t"])
def test_an_ambiguous_short_id_is_refused_in_one_line_listing_the_runs(root: Path, given: str) -> None:
    with pytest.raises(AmbiguousRun) as e:
        resolve_run_id(root, given)
    assert str(e.value) == (f"run id {given!r} is ambiguous: 2 runs match ({TRAIN_A}, {TRAIN_B}); "
                            "give more of the id")


def test_lineage_targets_take_short_run_ids_and_an_8_hex_run_tail_that_is_also_a_digest_prefix(root: Path) -> None:
    q = Ledger(root, sources=SOURCE_STAGES)
    assert q.resolve("1a2b3c4d") == Target("run", TRAIN_A)
    assert q.resolve("curate") == Target("run", CURATE)
    with pytest.raises(AmbiguousTarget, match="2 runs match"):
        q.resolve("train")
    f = RunFile(ledger_dir(root) / "curate-20260103T000000Z-00000001.jsonl", "curate-20260103T000000Z-00000001")
    f.append("run.started", EXAMPLES["run.started"])
    f.append("output", {**EXAMPLES["output"], "digest": "sha256:c0ffee00" + "0" * 56})  # CURATE's tail, as a digest
    with pytest.raises(AmbiguousTarget, match=f"ambiguous: 1 digests and a run match \\(run {CURATE}, sha256:c0ffee"):
        Ledger(root, sources=SOURCE_STAGES).resolve("c0ffee00")
    found = Ledger(root, sources=SOURCE_STAGES).resolve("sha256:c0ffee00")
    assert found == Target("digest", "sha256:c0ffee00" + "0" * 56)


def test_diff_takes_short_ids_and_shows_the_whole_ones(root: Path) -> None:
    d = diff(root, "1a2b3c4d", "train-20260102")
    assert (d.a, d.b) == (TRAIN_A, TRAIN_B)


def test_verify_resolves_a_short_id_at_step_1(root: Path) -> None:
    with pytest.raises(CannotVerify, match=f"step 1: run {TRAIN_B} is failed"):  # the whole id: resolved
        verify(root, "5e6f7a8b", index=Index.open(root))
    with pytest.raises(CannotVerify, match=f"step 1: run id 'train' is ambiguous: 2 runs match \\({TRAIN_A}, "):
        verify(root, "train", index=Index.open(root))


def test_marin_diff_refuses_an_ambiguous_short_id_in_one_line(root: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "marin.cli", "--root", str(root), "diff", "train", "c0ffee00"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"marin: error: run id 'train' is ambiguous: 2 runs match ({TRAIN_A}, "
                                     f"{TRAIN_B}); give more of the id"]
