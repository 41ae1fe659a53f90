"""A standard task offline (issue 39, item 4): lm-eval's own registry task ``lambada_openai`` runs by
its name on a hub dataset kept in the project, in the dataset's own format (written here: no hub is
reachable), pinned by digest like a corpus. The folder is a dependency of evaluate and an input of
its run; one changed byte makes `dvc status` and `marin status` name evaluate, breaks the pin and is
named by `marin verify`. A registry task without its dataset is refused in one line."""

from __future__ import annotations

import json
import math
import re

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import Project
from tests.test_harness_stage import harness_records

pytestmark = pytest.mark.slow

FOLDER = "data/hub/lambada"


def _texts(proj: Project, n: int = 20) -> list[str]:
    """lambada-style passages (the last word is the target) cut from the curated documents."""
    docs = pq.read_table(proj.root / "data/curated/train.parquet", columns=["text"]).column(0).to_pylist()
    words = [w for d in docs for w in d.split()]
    out = [" ".join(words[i:i + 14]) for i in range(0, len(words) - 13, 14)]
    assert len(out) >= n
    return out[:n]


def _harness(proj: Project, datasets: list[dict]) -> None:
    params = proj.params
    params["evaluate"]["harness"] = {"tasks": ["marin_cloze", "lambada_openai"], "seed": 7, "limit": 8,
                                     "datasets": datasets}
    proj.write_params(params)


def _commit(proj: Project, message: str) -> None:
    proj.git("add", "-A")
    proj.git("commit", "-qm", message)


def test_a_registry_task_runs_by_name_on_its_pinned_dataset_in_the_project(trained_project: Project) -> None:
    proj = trained_project
    _harness(proj, [])
    p = proj.stage("evaluate", check=False)  # no dataset listed: refused in one line, the other task goes on
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip().splitlines() == [
        "marin: error: harness task 'lambada_openai' reads the hub dataset EleutherAI/lambada_openai, which is not "
        "here (there is no hub); fetch it once into a project folder and list it in evaluate.harness.datasets "
        "(docs/guide/harness.md)"]

    texts = _texts(proj)
    (proj.root / FOLDER / "default").mkdir(parents=True)
    (proj.root / FOLDER / "default/test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ds = {"hub_id": "EleutherAI/lambada_openai", "path": FOLDER, "sha256": "0" * 64, "license": "MIT"}
    _harness(proj, [ds])
    assert proj.marin("stages", "--write").returncode == 0
    assert FOLDER in proj.run("git", "diff", "dvc.yaml").stdout  # a dependency of evaluate
    before = proj.ledger_files()
    p = proj.stage("evaluate", check=False)  # the placeholder pin: the digest found is printed, as for a corpus
    [line] = p.stderr.strip().splitlines()
    found = re.search(rf"{FOLDER} has sha256 ([0-9a-f]{{64}}), params.yaml pins 0{{64}}", line)
    assert found and found.group(1) != "0" * 64, line
    assert p.returncode != 0, line  # a refused pin fails the stage (issue 57: it was written into a result only)
    assert all(proj.ledger_files()[k] == v for k, v in before.items())

    _harness(proj, [{**ds, "sha256": found.group(1)}])
    _commit(proj, "lambada_openai on its dataset in the project")
    proj.dvc("repro", "--single-item", "evaluate")
    _commit(proj, "evaluated")
    v = harness_records(proj)["lambada_openai"]["values"]
    assert v["items"] == len(texts) and v["samples"] == 8 and v["limit"] == 8, v
    # lm-eval's own prompt and target over our rows: the passage without its last word, then that word
    lines = [json.loads(x) for x in (proj.root / "evals/harness/samples.jsonl").read_text().splitlines()]
    mine = [x for x in lines if x["task"] == "lambada_openai"]
    assert [x["doc"]["text"] for x in mine] == texts[:8]
    assert [x["target"] for x in mine] == [" " + t.split()[-1] for t in texts[:8]]
    assert [x["arguments"][0][0] for x in mine] == [" ".join(t.split()[:-1]) for t in texts[:8]]
    assert math.isclose(v["acc"]["value"], sum(x["acc"] for x in mine) / 8, abs_tol=1e-12)
    assert math.isclose(v["perplexity"]["value"], math.exp(-sum(x["perplexity"] for x in mine) / 8), rel_tol=1e-9)
    [run] = proj.runs("evaluate")[-1:]
    inputs = {x["body"]["name"]: x["body"] for x in run if x["kind"] == "input"}
    assert inputs[f"task:{FOLDER}"]["path"] == FOLDER
    assert (v["dataset"], v["dataset_split"]) == ("EleutherAI/lambada_openai", "test")  # the split lm-eval scored
    proj.stage("export")  # the uploaded card's model-index: the Hub links a result by dataset id and split
    card = yaml.safe_load((proj.root / "models/hf/README.md").read_text().split("---\n")[1])
    [index] = card["model-index"]
    dataset = {r["task"]["name"]: r["dataset"] for r in index["results"]}
    assert (dataset["lambada_openai"]["type"], dataset["lambada_openai"]["split"]) == ("EleutherAI/lambada_openai",
                                                                                      "test")
    assert (dataset["marin_cloze"]["type"], dataset["marin_cloze"]["split"]) == ("marin_cloze", "validation")

    with (proj.root / FOLDER / "default/test.jsonl").open("a") as f:  # one more passage
        f.write(json.dumps({"text": "and the king said unto them"}) + "\n")
    dvc = proj.dvc("status", "evaluate").stdout
    assert "evaluate" in dvc and FOLDER in dvc, dvc
    status = proj.marin("status")
    assert status.returncode == 1 and any(x.startswith("stale: evaluate") and FOLDER in x for x in
                                          (status.stdout + status.stderr).splitlines()), status.stdout
    verify = proj.marin("verify", run[0]["run_id"])
    assert verify.returncode != 0 and FOLDER in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    p = proj.stage("evaluate", check=False)  # the pin no longer holds: refused, named
    assert f"{FOLDER} has sha256" in p.stderr and found.group(1) in p.stderr, p.stderr
    assert proj.marin("ledger", "check").returncode == 0
