"""`marin sweep` on a marin project, with real DVC experiments in a temporary git repository: three
trials, one killed mid-run, each recorded in the ledger and shown in MLflow (a parent run with a child
per trial) and in the report with its status, runs and the selection."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Project, copy_project
from tests.test_experiments import exp_baseline, ledger_bpb

pytestmark = pytest.mark.slow


# -- a sweep of three trials, one killed ------------------------------------------------------

SWEPT_LRS = [0.001, 0.01, 0.003]
KILLED = 1


def kill_trial_once_it_logs(root: Path, trial: int, done: threading.Event) -> list[str]:
    """SIGKILL the train process of sweep trial ``trial`` once its run has recorded a metric (found
    by the tag each process carries and the run records); returns [run id] when it killed one."""
    import psutil

    while not done.is_set():
        procs = []  # the trial's train processes (a wrapper and its python may both match)
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "pipeline.train" in " ".join(p.info["cmdline"] or []) and \
                        p.environ().get("MARIN_SWEEP_TRIAL", "").endswith(f":{trial}"):
                    procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        for f in (root / "ledger" / "runs").glob("train-*.jsonl") if procs else ():
            lines = f.read_text().splitlines()
            first = json.loads(lines[0]) if lines else {}
            tag = (first.get("body", {}).get("execution") or {}).get("sweep", {})
            if tag.get("trial") == trial and any(json.loads(x)["kind"] == "metric" for x in lines[1:-1]):
                for p in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.send_signal(signal.SIGKILL)
                return [first["run_id"]]
        time.sleep(0.05)
    return []


@pytest.fixture(scope="module")
def swept(tmp_path_factory, _trained_project) -> tuple[Project, subprocess.CompletedProcess[str], list[str]]:
    """`marin sweep` over three learning rates on the committed tiny project; trial 1's training
    is killed once it has logged. (project, the sweep's process, [the killed run id])."""
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("sweep") / "proj")
    exp_baseline(proj)
    params = proj.params
    params["train"].update(steps=60, checkpoint_every=30, log_every=2)  # long enough to kill in the middle
    params["sweep"] = {"method": "grid", "space": [{"param": "train.lr", "values": SWEPT_LRS}],
                       "select": {"metric": "bits_per_byte", "goal": "min"}}
    proj.write_params(params)
    proj.git("commit", "-qam", "sweep the learning rate")
    done = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        killer = pool.submit(kill_trial_once_it_logs, proj.root, KILLED, done)
        result = proj.marin("sweep")
        done.set()
        killed = killer.result()
    proj.marin("mlflow", "sync", check=True)
    return proj, result, killed


def sweep_records(proj: Project) -> tuple[dict, list[dict], dict]:
    [run] = proj.runs("sweep")
    trials = [r["body"] for r in run if r["kind"] == "trial"]
    [selection] = [r["body"] for r in run if r["kind"] == "selection"]
    return run[0]["body"], trials, selection


def test_a_sweep_records_every_trial_the_killed_one_as_failed(swept) -> None:
    proj, result, killed = swept
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(killed) == 1, "the trial ended before it could be killed"
    started, trials, selection = sweep_records(proj)
    assert started["params"]["sweep"]["space"] == [{"param": "train.lr", "values": SWEPT_LRS}]
    assert started["params"]["baseline"] == {"train.lr": 3.0e-3}
    assert [t["params"] for t in trials] == [{"train.lr": lr} for lr in SWEPT_LRS]
    assert [t["status"] for t in trials] == ["succeeded", "failed", "succeeded"]
    runs = {r[0]["run_id"]: r for r in proj.runs()}
    sweep_id = proj.runs("sweep")[0][0]["run_id"]
    for t in trials:  # each trial's runs are ledger runs tagged with the sweep and the trial, with its params
        assert t["runs"] and all(runs[x["run_id"]][0]["body"]["execution"]["sweep"] ==
                                 {"run_id": sweep_id, "trial": t["index"]}
                                 for x in t["runs"])
        train = runs[t["runs"][0]["run_id"]]
        assert train[0]["body"]["params"]["train"]["lr"] == t["params"]["train.lr"]
        last = [r["body"] for r in train if r["kind"] == "metric"][-1]  # the last metrics, from the run itself
        assert t["metrics"]["step"] == last["step"] and t["metrics"]["loss"] == last["values"]["loss"]["value"]
    failed = trials[KILLED]
    assert [x["run_id"] for x in failed["runs"]] == killed and failed["runs"][0]["status"] == "unfinished"
    assert 0 < failed["metrics"]["step"] < 60 and "bits_per_byte" not in failed["metrics"]
    assert "train" in failed["error"]
    recorded = ledger_bpb(proj)
    best = min((0, 2), key=lambda i: recorded[SWEPT_LRS[i]])
    assert selection["trial"] == best and selection["value"] == recorded[SWEPT_LRS[best]]
    assert selection["rule"] == {"metric": "bits_per_byte", "goal": "min"}
    assert proj.params["train"]["lr"] == SWEPT_LRS[best]  # the selected experiment is applied
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_mlflow_shows_the_sweep_as_a_parent_with_one_child_per_trial(swept) -> None:
    from mlflow import MlflowClient

    proj, _, _ = swept
    _, trials, selection = sweep_records(proj)
    client = MlflowClient(f"sqlite:///{proj.root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("marin").experiment_id
    sweep_id = proj.runs("sweep")[0][0]["run_id"]
    [parent] = client.search_runs([exp], filter_string=f"tags.`marin.run_id` = '{sweep_id}'")
    children = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    children.sort(key=lambda r: int(r.data.tags["marin.trial"]))
    assert len(children) == 3
    assert [c.info.status for c in children] == ["FINISHED", "FAILED", "FINISHED"]
    for c, t in zip(children, trials, strict=True):
        assert float(c.data.params["train.lr"]) == t["params"]["train.lr"]
        assert c.data.tags["marin.runs"].split() == [x["run_id"] for x in t["runs"]]
        assert c.data.metrics["loss"] == t["metrics"]["loss"]
    assert parent.data.tags["marin.selected_trial"] == str(selection["trial"])
    assert children[selection["trial"]].data.tags.get("marin.selected") == "true"


def test_the_report_lists_every_trial_its_status_runs_and_the_selection(swept) -> None:
    proj, _, _ = swept
    proj.stage("export")  # the selected experiment is in the workspace: the report describes its model
    proj.stage("report")
    out = proj.root / "reports" / "marin-tiny"
    md = (out / "report.md").read_text()
    section = md.split("## Experiments", 1)[1].split("\n## ", 1)[0]
    _, trials, selection = sweep_records(proj)
    rows = [line for line in section.splitlines() if re.match(r"\| \d", line)]
    assert len(rows) == 3
    for row, t in zip(rows, trials, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0].startswith(str(t["index"])) and cells[1].startswith(f"[{t['status']}]")
        assert f"`train.lr` = [{t['params']['train.lr']:g}" in cells[2].replace("0.0100", "0.01")
        links = re.findall(r"\]\(([^)]+\.jsonl)\)", cells[-1])
        assert [Path(x).stem for x in links] == [r["run_id"] for r in t["runs"]]
        assert all((out / x).resolve().is_file() for x in links)  # each link opens the run's ledger file
        assert ("(selected)" in cells[0]) == (t["index"] == selection["trial"])
    assert "failed" in rows[KILLED] and "not recorded" in rows[KILLED]  # no bits per byte: killed in training
    assert f"Selected: trial {selection['trial']}, by the rule lowest bits_per_byte of 2 succeeded trial(s) of 3" \
        in section
    assert "(released model)" in rows[selection["trial"]]
    assert (out / "figures" / "sweep.svg").is_file() and "figures/sweep.svg" in section
    tokens = json.loads((proj.root / "data/tokens/manifest.json").read_text())["splits"]["train"]["tokens"]
    epochs = 60 * proj.params["train"]["batch_size"] * proj.params["model"]["seq_len"] / tokens
    said = f"training tokens [{epochs:,.4f}](#"
    assert epochs > 1 and said in md.split("- Memorisation:")[1].splitlines()[0]  # the risk states the real number
    assert f"Training read [{epochs:,.4f}](#" in md and "seen many times" not in md
    assert f"[{epochs:,.4f}](report.md#" in (out / "model_card.md").read_text()
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 4  # the three training curves and the sweep, inline
    r = proj.marin("report", "verify", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
