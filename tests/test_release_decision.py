"""Which report runs are releases (marin.report.release), in a real git repository: the decision a report
run records in run.started.execution.release and MLflow's registry follows (tests/test_registry.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from marin.report import release

ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, env=ENV, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def started(root: Path, dirty: bool = False, **execution: object) -> dict:
    commit = git(root, "rev-parse", "HEAD").strip()
    return {"code": {"git_commit": commit, "dirty": dirty}, **({"execution": execution} if execution else {})}


def test_a_clean_commit_of_main_is_a_release(repo: Path) -> None:
    got = release.decide(repo, False, started(repo))
    assert got == {"register": True, "why": f"a clean commit {git(repo, 'rev-parse', 'HEAD')[:12]} of main"}
    assert "registers its model as a version of m with the alias release" in release.line(got, "m")


@pytest.mark.parametrize(("case", "why"), [
    ("experiment", "a run of DVC experiment naggy-toea (`dvc exp run`)"),
    ("sweep", "a trial of sweep sweep-1"),
    ("dirty code", "uncommitted changes to the code or params.yaml"),
    ("params.yaml", "uncommitted changes to the code or params.yaml"),
    ("branch", "on branch try-lr, not main"),
    ("detached", "on a detached HEAD, not main"),
])
def test_anything_else_is_not_unless_params_say_register(repo: Path, case: str, why: str) -> None:
    body = started(repo)
    if case == "experiment":
        body = started(repo, dvc_experiment={"name": "naggy-toea", "baseline_rev": "abc"})
    elif case == "sweep":
        body = started(repo, sweep={"run_id": "sweep-1", "trial": 0})
    elif case == "dirty code":
        body = started(repo, dirty=True)
    elif case == "params.yaml":
        (repo / "params.yaml").write_text("seed: 2\n")
    elif case == "branch":
        git(repo, "checkout", "-qb", "try-lr")
    else:
        git(repo, "checkout", "-q", "--detach")
    assert release.decide(repo, False, body) == {"register": False, "why": why}
    assert "stays an MLflow LoggedModel" in release.line(release.decide(repo, False, body), "m")
    assert release.decide(repo, True, body) == {"register": True, "why": "report.register: true in params.yaml"}


def test_master_is_the_main_branch_of_a_repository_without_main(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "master")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    assert release.decide(tmp_path, False, started(tmp_path))["register"] is True
    git(tmp_path, "branch", "main")  # once main exists, master is a branch like any other
    assert release.decide(tmp_path, False, started(tmp_path))["why"] == "on branch master, not main"
