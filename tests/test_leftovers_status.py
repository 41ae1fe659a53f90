"""Issue 38, defect 12: any stage's start (``marin report`` too) removes the temporary folders
killed runs of every stage left, and keeps the one a live run holds. Each command runs as a
measured child process (tests/test_bounded.py's helpers); the ledger keeps every earlier record.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

from tests.conftest import Project
from tests.test_bounded import bounded, ledger_kept, run
from tests.test_bounded_ledger import HOLDER, _started


@pytest.mark.parametrize("argv", [("-m", "pipeline.evalsets"), ("-m", "pipeline.tokenize"),
                                  ("-m", "marin.cli", "report")])
def test_a_killed_curates_folder_is_removed_by_another_stages_start_and_a_live_one_kept(
        data_project: Project, argv: tuple[str, ...]) -> None:
    root, python = data_project.root, sys.executable
    live, held = _started([python, "-c", HOLDER, "data/curated"], root)  # a concurrent curate, alive
    killed, left = _started([python, "-c", HOLDER, "data/curated"], root)
    os.kill(killed.pid, signal.SIGKILL)  # kill -9 mid-write, as a killed curate leaves its folder
    killed.wait()
    before = data_project.ledger_files()
    try:
        child = run(data_project, *argv)
        if argv[-1] != "report":  # report refuses later (no trained model here): its start cleaned all the same
            assert child.code == 0, child.stderr[-2000:]
        bounded(child)
        assert f"marin: removed data/{left}, left behind by a stage that was killed" in child.stderr, child.stderr
        assert not (root / "data" / left).exists() and (root / "data" / held).is_dir()  # the live one stays
    finally:
        live.kill()
        live.wait()
    shutil.rmtree(root / "data" / held)
    ledger_kept(data_project, before)


def test_status_after_a_clean_merge_names_an_evaluation_of_the_previous_model(tmp_path, trained_project) -> None:
    from tests.conftest import copy_project

    proj = copy_project(trained_project, tmp_path / "merge")
    proj.dvc("commit", "-f", "-q", "-d", "evaluate")  # the stages ran as scripts: record evaluate of model v1
    proj.git("add", "-A")
    proj.git("commit", "-qm", "A: model v1, evaluated")
    clean = run(proj, "-m", "marin.cli", "status")
    assert "up to date: evaluate" in clean.stdout and "stale: evaluate" not in clean.stderr, clean.stderr
    base = proj.git("rev-parse", "--abbrev-ref", "HEAD").strip()
    proj.git("checkout", "-q", "-b", "retrain", base)
    params = proj.params
    params["train"]["steps"] = params["train"]["steps"] - 4
    proj.write_params(params)
    proj.dvc("repro", "--single-item", "train")  # B: model v2, not evaluated
    proj.git("add", "-A")
    proj.git("commit", "-qm", "B: retrained")
    proj.git("checkout", "-q", base)
    proj.dvc("checkout", "-q", "train")  # A's model v1 back on disk
    (proj.root / "NOTES.md").write_text("A went on after B branched off\n")
    proj.git("add", "NOTES.md")
    proj.git("commit", "-qm", "A: notes")  # so the merge is a real one, not a fast-forward
    proj.git("merge", "-q", "--no-edit", "retrain")  # clean: B only touched params, dvc.lock's train
    assert len(proj.git("rev-list", "--parents", "-n", "1", "HEAD").split()) == 3  # a merge commit
    proj.dvc("checkout", "-q", "train")  # the merged model on disk
    before = proj.ledger_files()
    child = run(proj, "-m", "marin.cli", "status")
    assert child.code == 1, child.stdout + child.stderr
    bounded(child)
    [line] = [x for x in child.stderr.splitlines() if x.startswith("stale: evaluate ")]
    assert "models/final is not the version the run read" in line, line
    ledger_kept(proj, before)


def test_status_names_an_evaluation_whose_model_is_gone(tmp_path, trained_project) -> None:
    """A removed input is not skipped: the evaluation of a model no longer on disk is not up to date."""
    from tests.conftest import copy_project

    proj = copy_project(trained_project, tmp_path / "gone")
    shutil.rmtree(proj.root / "models" / "final")
    before = proj.ledger_files()
    child = run(proj, "-m", "marin.cli", "status")
    assert child.code == 1, child.stdout + child.stderr
    bounded(child)
    [line] = [x for x in child.stderr.splitlines() if x.startswith("stale: evaluate ")]
    assert "input models/final is missing" in line, line
    ledger_kept(proj, before)
