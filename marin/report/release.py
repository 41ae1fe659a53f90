"""Whether a report run is a release, decided when it runs and recorded in its ``run.started``
(``execution.release``), so that MLflow's registry is a release log that ``marin mlflow sync`` rebuilds
from the ledger alone: a release is a report built on a clean commit of the main branch (``main``, or
``master`` where the repository has no ``main``), outside a DVC experiment and a sweep, or any report
run when params.yaml sets ``report.register: true``. Everything else stays an MLflow LoggedModel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marin.env import git

MAIN_BRANCHES = ("main", "master")


def decide(root: Path, register: bool, started: dict[str, Any]) -> dict[str, Any]:
    """``{"register": bool, "why": str}`` for the report run about to start (its run.started body)."""
    if register:
        return {"register": True, "why": "report.register: true in params.yaml"}
    execution, code = started.get("execution") or {}, started["code"]
    if "dvc_experiment" in execution:
        name = execution["dvc_experiment"]["name"]
        return {"register": False, "why": f"a run of DVC experiment {name} (`dvc exp run`)"}
    if "sweep" in execution:
        return {"register": False, "why": f"a trial of sweep {execution['sweep']['run_id']}"}
    if not code["git_commit"]:
        return {"register": False, "why": "no git commit"}
    if code["dirty"] or git(root, "diff", "HEAD", "--name-only", "--", "params.yaml"):
        return {"register": False, "why": "uncommitted changes to the code or params.yaml"}
    branch = (git(root, "symbolic-ref", "--short", "-q", "HEAD") or "").strip()
    main = main_branch(root)
    if branch != main:
        where = f"branch {branch}" if branch else "a detached HEAD"
        return {"register": False, "why": f"on {where}, not {main}"}
    return {"register": True, "why": f"a clean commit {code['git_commit'][:12]} of {main}"}


def main_branch(root: Path) -> str:
    """``main``, or ``master`` where the repository has a ``master`` branch and no ``main``."""
    for name in MAIN_BRANCHES:
        if git(root, "rev-parse", "--verify", "-q", f"refs/heads/{name}"):
            return name
    return MAIN_BRANCHES[0]


def line(release: dict[str, Any], model_name: str) -> str:
    """What the report stage says about it: one line."""
    if release["register"]:
        return (f"report: a release ({release['why']}): MLflow registers its model as a version of {model_name} "
                "with the alias release")
    return (f"report: not a release ({release['why']}): its model stays an MLflow LoggedModel; a clean commit of "
            "the main branch, or report.register: true, registers one")
