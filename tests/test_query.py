"""Target resolution in the ledger's read API (marin.ledger.query) on a small ledger written through
the ledger's own appender: run ids, digests and prefixes, recorded paths, and the refusals."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from marin import hashing
from marin.ledger.query import AmbiguousTarget, Ledger, Target, UnknownTarget, resolve
from marin.ledger.records import new_run_id
from marin.ledger.store import RunFile
from marin.paths import ledger_dir
from marin.stages import SOURCE_STAGES
from tests.test_records import EXAMPLES

TWIN_A = "sha256:" + "abcdef0123" + "1" * 54  # two digests sharing their first 10 hex digits
TWIN_B = "sha256:" + "abcdef0123" + "2" * 54
PATH = "data/curated/train.parquet"


def write_run(root: Path, stage: str, outputs: list[dict[str, Any]], status: str = "succeeded") -> str:
    """A finished run of ``stage`` that wrote ``outputs``; returns its run id."""
    run_id = new_run_id(stage)
    f = RunFile(ledger_dir(root) / f"{run_id}.jsonl", run_id)
    f.append("run.started", {**EXAMPLES["run.started"], "stage": stage})
    for out in outputs:
        f.append("output", {**EXAMPLES["output"], **out})
    f.append("run.finished", lambda n, r: {**EXAMPLES["run.finished"], "status": status, "records": n,
                                           "merkle_root": hashing.fmt(r)})
    time.sleep(0.002)  # runs are ordered by their start time
    return run_id


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ledger_dir(tmp_path).mkdir(parents=True)
    (tmp_path / "data/curated").mkdir(parents=True)
    runs = {"a": write_run(tmp_path, "curate", [{"name": "train", "path": PATH, "digest": TWIN_A}]),
            "b": write_run(tmp_path, "curate", [{"name": "train", "path": PATH, "digest": TWIN_B}]),
            "failed": write_run(tmp_path, "curate", [{"name": "train", "path": PATH,
                                                      "digest": "sha256:" + "ee" * 32}], status="failed")}
    return tmp_path, runs


def test_a_run_id_is_a_run(ledger) -> None:
    root, runs = ledger
    assert resolve(root, runs["a"], SOURCE_STAGES) == Target("run", runs["a"])


def test_a_digest_with_or_without_its_prefix_and_any_unique_prefix_of_8_or_more(ledger) -> None:
    root, _ = ledger
    for given in (TWIN_A, TWIN_A[7:], TWIN_A[:7 + 11], TWIN_A[7:7 + 11]):
        assert resolve(root, given, SOURCE_STAGES) == Target("digest", TWIN_A), given
    full_b = "sha256:" + "ee" * 32
    # 8 digits: the shortest prefix accepted
    assert resolve(root, "eeeeeeee", SOURCE_STAGES) == Target("digest", full_b)


def test_a_shared_prefix_is_ambiguous_and_names_the_candidates(ledger) -> None:
    root, _ = ledger
    with pytest.raises(AmbiguousTarget) as e:
        resolve(root, "abcdef0123", SOURCE_STAGES)
    assert "ambiguous: 2 digests match" in str(e.value) and "sha256:abcdef012311" in str(e.value)
    assert "sha256:abcdef012322" in str(e.value) and "give more digits" in str(e.value)


def test_a_prefix_below_8_digits_is_not_a_digest(ledger) -> None:
    root, _ = ledger
    with pytest.raises(UnknownTarget, match="is not a run id, a digest or a path that any run in the ledger wrote"):
        resolve(root, "eeeeeee", SOURCE_STAGES)


def test_a_recorded_path_not_on_disk_is_what_its_latest_succeeded_run_wrote(ledger) -> None:
    root, runs = ledger
    assert resolve(root, PATH, SOURCE_STAGES) == Target("digest", TWIN_B, f"{PATH} does not exist; showing what "
                                                        f"run {runs['b']} wrote there")  # not the later failed run's


def test_a_path_on_disk_resolves_by_its_bytes(ledger) -> None:
    root, runs = ledger
    (root / PATH).write_bytes(b"these bytes")
    digest = hashing.digest_path(root / PATH).digest
    assert resolve(root, PATH, SOURCE_STAGES).note == f"{PATH} differs from every recorded output; showing what run " \
                                       f"{runs['b']} wrote there"
    write_run(root, "curate", [{"name": "train", "path": PATH, "digest": digest}])
    assert resolve(root, PATH, SOURCE_STAGES) == Target("digest", digest)  # the bytes a run recorded: no note
    assert resolve(root, str(root / PATH), SOURCE_STAGES) == Target("digest", digest)  # absolute paths too


def test_an_unknown_target_is_refused(ledger) -> None:
    root, _ = ledger
    for target in ("curate-20990101T000000Z-00000000", "data/elsewhere.parquet", "sha256:" + "0" * 64):
        with pytest.raises(UnknownTarget, match="see `marin ledger log`"):
            resolve(root, target, SOURCE_STAGES)


def test_one_ledger_answers_many_targets_from_one_index(ledger) -> None:
    root, runs = ledger
    q = Ledger(root, sources=SOURCE_STAGES)
    assert [q.resolve(t).key for t in (runs["b"], TWIN_B[7:19])] == [runs["b"], TWIN_B]
    step = q.node(q.resolve(runs["b"]))
    assert (step.stage, step.status, [a.digest for a in step.outputs]) == ("curate", "succeeded", [TWIN_B])
