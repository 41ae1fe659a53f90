"""Where `marin verify` finds a run's recorded inputs (issue 55, item 1): the git worktree at the recorded
commit, the DVC cache, the DVC remote, the project's copy, in that order; an input found nowhere is exit 4,
never a mismatch. The remote case runs real DVC: the outputs committed to its cache, pushed to a local
remote, the cache removed and the project's copy changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from marin.errors import IntegrityError
from marin.remote import dir_listing
from tests.conftest import Project

GOOD = {"md5": "0" * 32, "relpath": "a/b.parquet"}


@pytest.mark.parametrize("listing", [
    "not json", {}, [1], [{"md5": "0" * 32}], [{**GOOD, "relpath": "../escape"}], [{**GOOD, "relpath": "/abs"}],
    [{**GOOD, "md5": "zz"}], [{**GOOD, "md5": "0" * 32 + ".dir"}], [{**GOOD, "relpath": ""}],
])
def test_a_dvc_dir_listing_is_checked_by_shape(tmp_path: Path, listing: object) -> None:
    f = tmp_path / "x.dir"
    f.write_text(listing if isinstance(listing, str) else json.dumps(listing))
    with pytest.raises(IntegrityError):
        dir_listing(f)


def test_a_dvc_dir_listing_of_the_right_shape_is_read(tmp_path: Path) -> None:
    f = tmp_path / "x.dir"
    f.write_text(json.dumps([GOOD, {**GOOD, "relpath": "c"}]))
    assert dir_listing(f) == [GOOD, {**GOOD, "relpath": "c"}]


@pytest.mark.slow
def test_an_input_gone_from_cache_and_project_is_restored_from_the_dvc_remote(trained_project: Project,
                                                                               tmp_path: Path) -> None:
    proj = trained_project
    proj.dvc("commit", "-f", "curate")  # the curated split into DVC's cache and dvc.lock
    proj.dvc("remote", "add", "-d", "store", str(tmp_path / "remote"))
    proj.dvc("push", "curate")
    shutil.rmtree(proj.root / ".dvc" / "cache")
    train = proj.root / "data" / "curated" / "train.parquet"
    original = train.read_bytes()
    train.write_bytes(original[:-1] + b"\0")  # the project's copy changed since
    [run] = proj.runs("tokenize")
    v = proj.marin("verify", run[0]["run_id"])
    assert v.returncode == 0 and "BIT-EXACT" in v.stdout, v.stdout + v.stderr
    assert "input train: restored from the DVC remote" in v.stdout, v.stdout
    train.write_bytes(original)
    assert proj.marin("ledger", "check").returncode == 0  # the verification record appended in the chain
