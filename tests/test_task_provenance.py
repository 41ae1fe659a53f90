"""A lab's own harness task is in the provenance (issue 39, item 1): its folder and the data files it
reads are dependencies of the evaluate stage in dvc.yaml and inputs of the evaluate run, by digest. One
line appended to the task's JSONL makes `dvc status` and `marin status` name evaluate; `marin verify`
of the earlier run restores the task as recorded from the git worktree at the run's commit and is
BIT-EXACT, whether the edit is uncommitted or a committed task update (issue 55, item 1: it was called
MISMATCH); a dvc.yaml that does not list them is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.test_harness_stage import LAB_TASK

pytestmark = pytest.mark.slow


def _lab_task(proj: Project, data_dir: str) -> None:
    """tasks/lab.yaml reading ``data_dir``/lab.jsonl (inside or outside the task folder)."""
    root = proj.root
    (root / "tasks").mkdir()
    (root / "tasks/lab.yaml").write_text(LAB_TASK.replace("labtasks/lab.jsonl", f"{data_dir}/lab.jsonl"))
    (root / data_dir).mkdir(exist_ok=True)
    (root / data_dir / "lab.jsonl").write_text("".join(
        json.dumps({"prompt": f"The king and the {w}", "answer": w}) + "\n" for w in ("lord", "queen", "crown")))
    params = proj.params
    params["evaluate"]["harness"] = {"tasks": ["lab_cloze"], "include": ["tasks"], "seed": 7}
    proj.write_params(params)


@pytest.mark.parametrize("data_dir", ["tasks", "labdata"])
def test_editing_a_lab_tasks_data_names_evaluate_everywhere(trained_project: Project, data_dir: str) -> None:
    proj = trained_project
    _lab_task(proj, data_dir)
    refused = proj.stage("evaluate", check=False)  # dvc.yaml does not list the task yet
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1 and "marin stages --write" in lines[0] \
        and "tasks" in lines[0], refused.stderr
    assert proj.marin("stages", "--write").returncode == 0
    deps = [d for d in _dvc_yaml_deps(proj.root, "evaluate") if not d.startswith("marin/")]
    want = ["tasks"] + ([f"{data_dir}/lab.jsonl"] if data_dir != "tasks" else [])
    assert deps[-len(want):] == want, deps
    proj.git("add", "-A")
    proj.git("commit", "-qm", "a lab task")
    proj.dvc("repro", "--single-item", "evaluate")
    proj.git("add", "-A")
    proj.git("commit", "-qm", "evaluated")
    [run] = [r for r in proj.runs("evaluate") if any(x["kind"] == "eval" and x["body"]["name"] == "harness:lab_cloze"
                                                       for x in r)]
    inputs = {x["body"]["name"]: x["body"]["path"] for x in run if x["kind"] == "input"}
    assert {f"task:{p}": p for p in want}.items() <= inputs.items(), inputs
    assert "evaluate" not in proj.dvc("status", "evaluate").stdout  # up to date before the edit

    with (proj.root / data_dir / "lab.jsonl").open("a") as f:  # one more item
        f.write(json.dumps({"prompt": "The king and the", "answer": "realm"}) + "\n")
    dvc = proj.dvc("status", "evaluate").stdout
    assert "evaluate" in dvc and f"{data_dir}" in dvc, dvc
    status = proj.marin("status")
    stale = [x for x in (status.stdout + status.stderr).splitlines() if x.startswith("stale: evaluate")]
    assert status.returncode == 1 and stale and any(data_dir in x for x in stale), status.stdout + status.stderr
    if data_dir != "tasks":  # a routine task update, committed
        proj.git("commit", "-qam", "one more lab item")
    rid = run[0]["run_id"]
    before = (proj.root / "ledger/runs" / f"{rid}.jsonl").read_bytes()
    v = proj.marin("verify", rid)
    assert v.returncode == 0 and "BIT-EXACT" in v.stdout, v.stdout + v.stderr
    commit = run[0]["body"]["code"]["git_commit"]
    assert all(f"input task:{p}: restored from git worktree at {commit[:12]}" in v.stdout for p in want), v.stdout
    after = (proj.root / "ledger/runs" / f"{rid}.jsonl").read_text().splitlines()[len(before.splitlines()):]
    assert [json.loads(x)["body"]["result"] for x in after] == ["bit-exact"]
    assert proj.marin("ledger", "check").returncode == 0


def test_a_task_data_file_outside_the_project_is_refused_in_one_line(trained_project: Project,
                                                                     tmp_path: Path) -> None:
    proj = trained_project
    _lab_task(proj, "tasks")
    (proj.root / "tasks/lab.yaml").write_text(LAB_TASK.replace("labtasks/lab.jsonl", str(tmp_path / "x.jsonl")))
    r = proj.marin("stages", "--write")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "outside the project" in lines[0] and "tasks/lab.yaml" in lines[0]


def _dvc_yaml_deps(root: Path, stage: str) -> list[str]:
    import yaml

    return [str(d) for d in yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]["deps"]]
