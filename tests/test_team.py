"""A team's MLflow: `mlflow server` on a real PostgreSQL with its artifacts on a real S3 server,
all on 127.0.0.1. Several stages syncing at once, idempotence, the REST audit, the model
downloaded through MLflow, the model-training view in Chromium, live metrics while training
and the server stopped in the middle of it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import rfc8785
from mlflow import MlflowClient

from tests.conftest import BIN, Project, copy_project, env_for_subprocess
from tests.servers import S3_ENV, Postgres
from tests.servers import MlflowServer as Server
from tests.test_tracking import assert_mirrors_the_ledger, lineage_from_rest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def team(tmp_path_factory, s3):
    pg = Postgres().start()
    try:
        s3.bucket("mlflow-team")
        server = Server(tmp_path_factory.mktemp("team"), backend=pg.create_db("mlflow"),
                        artifacts="s3://mlflow-team/artifacts", env={**S3_ENV, "MLFLOW_S3_ENDPOINT_URL": s3.url})
        server.start()
        yield server
        server.stop()
    finally:
        pg.stop()


@pytest.fixture(scope="module")
def synced(tmp_path_factory, _trained_project, team) -> Project:
    """The trained tiny project, mirrored by three `marin mlflow sync`s started at the same moment."""
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("teamproj") / "proj")
    proj.env.update(MLFLOW_TRACKING_URI=team.uri)
    env = {**env_for_subprocess(), **proj.env}
    procs = [subprocess.Popen([str(BIN / "python"), "-m", "marin.cli", "mlflow", "sync"], cwd=proj.root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    return proj


def client(team: Server) -> tuple[MlflowClient, str]:
    c = MlflowClient(team.uri)
    return c, c.get_experiment_by_name("marin").experiment_id


def test_stages_syncing_at_once_make_one_mirror_and_a_second_sync_changes_nothing(synced, team) -> None:
    c, exp = client(team)
    runs = c.search_runs([exp], max_results=1000)
    ids = [r.data.tags.get("marin.run_id") or r.data.tags["marin.pipeline"] for r in runs]
    assert sorted(ids) == sorted({*ids}), "a ledger run mirrored twice"
    assert len([r for r in runs if r.data.tags.get("marin.kind") == "pipeline"]) == 1
    [evaluate] = [r for r in runs if r.data.tags.get("marin.stage") == "evaluate"]  # its table written once, not 3x
    samples = (synced.root / "evals/harness/samples.jsonl").read_text().count("\n")
    table = c.download_artifacts(evaluate.info.run_id, "eval_results_table.json", str(synced.root / "dl-table"))
    assert len(json.loads(Path(table).read_text())["data"]) == samples > 0  # MLflow's table: pandas' split layout
    assert_mirrors_the_ledger(synced, team.uri)
    r = synced.marin("mlflow", "sync", check=True)
    assert f"0 run(s) created, 0 updated, {len(synced.runs())} unchanged" in r.stdout


def test_audit_over_rest_against_the_team_server(synced, team) -> None:
    audit = lineage_from_rest(team)
    assert [c["stage"] for c in audit["chain"]] == ["train", "tokenize", "curate", "fetch"]
    ledger = {recs[0]["run_id"]: recs for recs in synced.runs()}
    for c in audit["chain"]:
        assert c["recipe"] == ledger[c["run_id"]][0]["body"]["recipe_digest"]
        assert c["inputs"] == sorted(x["body"]["digest"] for x in ledger[c["run_id"]] if x["kind"] == "input")


def first_model(synced: Project, c: MlflowClient, exp: str):
    """The LoggedModel of the project's first train run (the live-metrics test trains a second one
    in the same module's project, which test order may put first)."""
    first = synced.runs("train")[0][0]["run_id"]
    [model] = [m for m in c.search_logged_models(experiment_ids=[exp]) if m.tags.get("marin.run_id") == first]
    return model


def tensor_digest(path: Path) -> str:
    """The ledger's tensor digest, computed here without marin: sha256 over each tensor's
    length-prefixed canonical header (path, dtype, shape) and bytes, in path order."""
    from safetensors.numpy import load_file

    h = hashlib.sha256()
    for name, arr in sorted(load_file(str(path)).items()):
        header = rfc8785.dumps({"path": name, "dtype": str(arr.dtype), "shape": list(arr.shape)})
        h.update(len(header).to_bytes(8, "big") + header)
        h.update(arr.nbytes.to_bytes(8, "big") + arr.tobytes())
    return "sha256:" + h.hexdigest()


def test_the_model_downloads_from_mlflow_with_its_recorded_digest(synced, team, tmp_path) -> None:
    import mlflow

    c, exp = client(team)
    model = first_model(synced, c, exp)
    assert model.artifact_location.startswith("mlflow-artifacts:")  # served by the server, stored on S3
    dest = Path(mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location,
                                                    dst_path=str(tmp_path), tracking_uri=team.uri))
    assert (dest / "MLmodel").is_file()  # a pyfunc model: its weights, config and tokenizer under artifacts/
    assert sorted(p.name for p in (dest / "artifacts" / "final").iterdir()) == ["config.json", "model.safetensors"]
    train = synced.runs("train")[0]  # the first model's run (first_model)
    out = next(x["body"] for x in train if x["kind"] == "output" and x["body"]["name"] == "model")
    weights = dest / "artifacts" / "final" / "model.safetensors"
    assert tensor_digest(weights) == out["tensor_digest"] == model.tags["marin.tensor_digest"]
    tok = next(x["body"] for recs in synced.runs("tokenize") for x in recs
               if x["kind"] == "output" and x["body"]["name"] == "tokenizer")
    assert "sha256:" + hashlib.sha256((dest / "artifacts" / "tokenizer.json").read_bytes()).hexdigest() == tok["digest"]


# The run page's state, read in the page: each metric chart card's drawn line traces (plotly
# paths with at least two points) and their box and colour; spinners and skeletons still showing.
CHARTS = """(() => {
  if (!document.body) return null;
  const cards = {};
  for (const card of document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')) {
    const title = card.querySelector('h4[title]'), plot = card.querySelector('.js-plotly-plot');
    if (!title || !plot) continue;
    const lines = [...plot.querySelectorAll('path.js-line')].filter(p => /L/.test(p.getAttribute('d') || ''));
    const r = plot.getBoundingClientRect();
    cards[title.title] = {lines: lines.length, box: [r.left, r.top, r.right, r.bottom].map(Math.round),
                          stroke: lines.length ? getComputedStyle(lines[0]).stroke : null};
  }
  const busy = document.querySelectorAll('[class*="-spin-spinning"], [class*="-skeleton"]').length;
  return {cards, busy, text: document.body.innerText.split('\\n').map(s => s.trim())};
})()"""
CHARTED = ("loss", "grad_norm", "tokens_per_s")


def drawn(state: dict | None) -> bool:
    return bool(state) and state["busy"] == 0 and all(state["cards"].get(k, {}).get("lines") for k in CHARTED)


def trace_pixels(px, state: dict, key: str) -> int:
    """Pixels of the chart's box in the screenshot within a few levels of its trace's colour."""
    import numpy as np

    left, top, right, bottom = state["cards"][key]["box"]
    rgb = [int(v) for v in state["cards"][key]["stroke"].removeprefix("rgb(").rstrip(")").split(",")[:3]]
    return int((np.abs(px[top:bottom, left:right] - np.array(rgb)).max(axis=2) < 40).sum())


def test_the_ui_opens_a_training_run_in_the_model_training_view(synced, team, tmp_path) -> None:
    import numpy as np
    from PIL import Image

    from tests.browser import Browser

    c, exp = client(team)
    assert c.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"
    train = next(r for r in c.search_runs([exp]) if r.data.tags.get("marin.stage") == "train")
    assert {"loss", "lr", "grad_norm"} <= set(train.data.metrics)
    # MLflow 3.17's UI picks GenAI or model training from a global switch (default GenAI) that a link
    # can set: `marin mlflow sync` prints the experiment's link with it.
    link = next(w for w in synced.marin("mlflow", "sync", check=True).stdout.split() if "workflowType=" in w)
    assert link == f"{team.uri}/#/experiments/{exp}?workflowType=machine_learning"
    url = f"{team.uri}/#/experiments/{exp}/runs/{train.info.run_id}/model-metrics?workflowType=machine_learning"
    shot = Path(os.environ.get("MARIN_SCREENSHOT_DIR", tmp_path)) / "mlflow-train-run.png"
    with Browser(tmp_path / "profile") as browser:
        browser.open(url)
        for _ in range(3):  # the page refreshes itself now and then (spinners): the state on both sides
            before = browser.wait(CHARTS, drawn, timeout=180)
            browser.screenshot(shot)
            after = browser.js(CHARTS)
            if drawn(before) and after == before:
                break
    assert drawn(before) and after == before, before and {k: v for k, v in before.items() if k != "text"}
    text = before["text"]
    assert train.info.run_name in text  # the run's own page
    assert "Models" in text and "Model metrics" in text  # the model-training view: Runs, Models, Traces
    for genai in ("Agent versions", "Evaluation runs", "Prompts", "Judges", "Sessions"):  # the GenAI view's
        assert genai not in text, genai
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert px.std() > 10, "blank page"
    for key in CHARTED:  # the lines are in the image, not only in the page: a drawn trace is long
        assert trace_pixels(px, before, key) > 150, key


TEXT = "document.body ? {busy: document.querySelectorAll('[class*=\"-spin-spinning\"], [class*=\"-skeleton\"]')" \
       ".length, text: document.body.innerText.split('\\n').map(s => s.trim())} : null"


def test_the_ui_lists_the_pyfunc_models_files_in_the_model_training_view(synced, team, tmp_path) -> None:
    import numpy as np
    from PIL import Image

    from tests.browser import Browser

    c, exp = client(team)
    model = first_model(synced, c, exp)
    url = f"{team.uri}/#/experiments/{exp}/models/{model.model_id}/artifacts?workflowType=machine_learning"
    shot = Path(os.environ.get("MARIN_SCREENSHOT_DIR", tmp_path)) / "mlflow-model-files.png"
    with Browser(tmp_path / "profile") as browser:
        browser.open(url)
        state = browser.wait(TEXT, lambda s: bool(s) and s["busy"] == 0 and "MLmodel" in s["text"], timeout=180)
        browser.screenshot(shot)
    text = state["text"]
    assert "MLmodel" in text and "artifacts" in text and "python_env.yaml" in text  # the pyfunc model's files
    assert model.name in text and "Model registry" in text  # its own page, in the model-training view's sidebar
    for genai in ("Agent versions", "Evaluation runs", "Prompts", "Judges", "Sessions"):
        assert genai not in text, genai
    assert np.asarray(Image.open(shot).convert("RGB")).astype(int).std() > 10, "blank page"


def test_live_metrics_reach_mlflow_while_training_and_a_stopped_server_fails_nothing(synced, team) -> None:
    params = synced.params
    params["train"].update(steps=80, log_every=2, checkpoint_every=4)
    synced.write_params(params)
    synced.env.update(MARIN_MLFLOW="on", MARIN_MLFLOW_LIVE_EVERY="1", MARIN_MLFLOW_LIVE_SECONDS="0.2")
    before = {r[0]["run_id"] for r in synced.runs("train")}
    proc = subprocess.Popen([str(BIN / "python"), "-m", "pipeline.train"], cwd=synced.root,
                            env={**env_for_subprocess(), **synced.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    c, exp = client(team)
    seen, new_run, finished = 0, None, False
    while proc.poll() is None and seen == 0:
        new = [r for r in synced.runs("train") if r[0]["run_id"] not in before]
        if new:
            new_run = new[0][0]["run_id"]
            found = c.search_runs([exp], filter_string=f"tags.`marin.run_id` = '{new_run}'")
            seen = len(c.get_metric_history(found[0].info.run_id, "loss")) if found else 0
            finished = any(x["kind"] == "run.finished" for x in synced.runs("train")[-1])
        time.sleep(0.2)
    assert seen > 0 and not finished, "no metric reached MLflow before the stage ended"
    team.stop()  # MLflow goes away in the middle of training
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "live metrics to MLflow stopped" in err and "MLflow not updated" in err
    team.start()
    assert "1 updated" in synced.marin("mlflow", "sync", check=True).stdout
    found = c.search_runs([exp], filter_string=f"tags.`marin.run_id` = '{new_run}'")
    history = sorted((m.step, m.value) for m in c.get_metric_history(found[0].info.run_id, "loss"))
    recorded = sorted((x["body"]["step"], x["body"]["values"]["loss"]["value"])
                      for x in synced.runs("train")[-1] if x["kind"] == "metric")
    assert history == recorded and len(recorded) == 40  # every step once: live and final sync reconciled
    assert found[0].info.status == "FINISHED"
