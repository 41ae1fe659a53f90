"""The MLflow view: real MLflow on SQLite, and a real `mlflow server` on 127.0.0.1."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import BIN, Project, copy_project, env_for_subprocess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def _trained(tmp_path_factory, _trained_project) -> Project:
    """The session's trained tiny project (tests/conftest.py) with MLflow's empty SQLite store created
    once (its schema migrations take seconds); each test works on its own copy."""
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("tracked") / "proj")
    MlflowClient(f"sqlite:///{proj.root / 'mlflow.db'}").search_experiments()
    return proj


@pytest.fixture
def trained(tmp_path, _trained) -> Project:
    dest = tmp_path / "proj"
    shutil.copytree(_trained.root, dest, symlinks=True)
    return Project(dest)


def store(proj: Project, uri: str | None = None) -> tuple[MlflowClient, str]:
    client = MlflowClient(uri or f"sqlite:///{proj.root / 'mlflow.db'}")
    return client, client.get_experiment_by_name("marin").experiment_id


def flat(prefix, obj, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            flat(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = obj if isinstance(obj, str) else json.dumps(obj)
    return out


def snapshot(client: MlflowClient, exp: str) -> dict:
    """Everything a sync could change, in a comparable form."""
    out = {}
    for r in client.search_runs([exp], max_results=1000):
        arts = sorted(a.path for top in client.list_artifacts(r.info.run_id) for a in
                      ([top] if not top.is_dir else client.list_artifacts(r.info.run_id, top.path)))
        history = {k: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(r.info.run_id, k)]
                   for k in r.data.metrics}
        out[r.info.run_id] = (r.data.params, r.data.tags, history, arts, r.info.status, r.info.end_time,
                              len(r.inputs.dataset_inputs))
    out["models"] = sorted((m.model_id, tuple(sorted(m.tags.items())), len(m.metrics or []))
                           for m in client.search_logged_models(experiment_ids=[exp]))
    return out


def assert_mirrors_the_ledger(trained: Project, uri: str | None = None) -> None:
    """Every ledger run is in the MLflow store with its fields, read back through the client."""
    client, exp = store(trained, uri)
    runs = {x.data.tags["marin.run_id"]: x for x in client.search_runs([exp]) if "marin.run_id" in x.data.tags}
    ledger = trained.runs()
    assert set(runs) == {recs[0]["run_id"] for recs in ledger}
    parents = {x.info.run_id for x in client.search_runs([exp]) if x.data.tags.get("marin.kind") == "pipeline"}
    for recs in ledger:
        started = recs[0]["body"]
        m = runs[recs[0]["run_id"]]
        assert m.data.tags["marin.recipe_digest"] == started["recipe_digest"]
        assert m.data.tags["marin.stage"] == started["stage"]
        stage_row = next(r for r in m.data.tags["mlflow.note.content"].splitlines() if r.startswith("| `marin.stage`"))
        assert started["stage"] in stage_row.split("|")[2].replace(",", " ").split()  # the run's description names it
        assert m.data.tags["mlflow.source.git.commit"] == started["code"]["git_commit"]
        assert m.data.tags["mlflow.parentRunId"] in parents
        for k, v in flat("", started["params"], {}).items():
            assert m.data.params[k] == v[:6000]
        inputs = [x["body"] for x in recs if x["kind"] == "input"]
        got = {d.dataset.name: (d.dataset.digest, {t.key: t.value for t in d.tags}) for d in m.inputs.dataset_inputs}
        for i in inputs:
            digest, tags = got[i["name"]]
            assert digest == i["digest"][7:39] and tags["marin.digest"] == i["digest"]
            assert tags["mlflow.data.context"] == ("evaluation" if started["stage"] in (
                "evalsets", "decontaminate", "trace_index") or started["stage"].startswith("evaluate") else "training")
        for metric in (x["body"] for x in recs if x["kind"] == "metric"):
            for key, v in metric["values"].items():
                history = {h.step: h.value for h in client.get_metric_history(m.info.run_id, key)}
                assert history[metric["step"]] == v["value"]
        ledger_art = Path(client.download_artifacts(m.info.run_id, f"ledger/{recs[0]['run_id']}.jsonl",
                                                    str(trained.root / "dl")))
        assert ledger_art.read_bytes() == (trained.root / "ledger/runs" / ledger_art.name).read_bytes()
        assert m.info.status == "FINISHED"

    train = next(recs for recs in ledger if recs[0]["body"]["stage"] == "train")
    out = next(x["body"] for x in train if x["kind"] == "output" and x["body"]["name"] == "model")
    models = client.search_logged_models(experiment_ids=[exp])  # one per model output (train's, sft's) and export
    assert len(models) == sum(x["kind"] == "output" and x["body"]["name"] in ("model", "hf_model")
                              for recs in ledger for x in recs)
    [model] = [m for m in models if m.tags["marin.tensor_digest"] == out["tensor_digest"]
               and m.model_type == "marin-decoder"]
    assert model.tags["marin.location"] == (trained.root / "models/final").resolve().as_uri()
    evaluate = next(recs for recs in ledger if recs[0]["body"]["stage"] == "evaluate")
    bpb = next(x["body"]["values"]["bits_per_byte"]["value"] for x in evaluate
               if x["kind"] == "eval" and x["body"]["name"] == "model" and "corpus" not in x["body"])
    linked = {mm.key: mm for mm in model.metrics}
    assert linked["eval/validation/bits_per_byte"].value == bpb
    assert linked["eval/validation/bits_per_byte"].dataset_name == "tokens"


def test_sync_mirrors_every_ledger_run(trained) -> None:
    r = trained.marin("mlflow", "sync")
    assert r.returncode == 0, r.stderr
    assert f"{len(trained.runs())} run(s) created" in r.stdout  # one per stage run
    assert_mirrors_the_ledger(trained)


def test_second_sync_changes_nothing(trained) -> None:
    trained.marin("mlflow", "sync", check=True)
    client, exp = store(trained)
    before = snapshot(client, exp)
    r = trained.marin("mlflow", "sync", check=True)
    assert f"0 run(s) created, 0 updated, {len(trained.runs())} unchanged" in r.stdout
    assert snapshot(client, exp) == before


def test_stage_syncs_itself_to_the_embedded_store(trained) -> None:
    trained.env["MARIN_MLFLOW"] = "on"
    trained.stage("evaluate")
    client, exp = store(trained)
    newest = trained.runs("evaluate")[-1][0]["run_id"]
    found = client.search_runs([exp], filter_string=f"tags.`marin.run_id` = '{newest}'")
    assert len(found) == 1 and found[0].info.status == "FINISHED"


def test_run_names_are_short_and_distinct_with_key_facts_in_short_tags(trained) -> None:
    """The run list cuts long names and shows tag keys cut to "marin.…": names stay short and
    unique across the pipeline's runs (two evaluate runs here), facts sit under short tag keys."""
    trained.env["MARIN_MLFLOW"] = "on"
    trained.stage("evaluate")  # a second evaluate run, synced with the rest by the stage itself
    client, exp = store(trained)
    runs = client.search_runs([exp], max_results=1000)
    names = [r.info.run_name for r in runs]
    assert len(runs) == len(trained.runs()) + 1, names  # the stage runs and their pipeline
    assert len(set(names)) == len(names), names
    assert all(len(n) <= 24 for n in names), names
    ledger = {recs[0]["run_id"]: recs[0]["body"] for recs in trained.runs()}
    stages = [r for r in runs if "marin.run_id" in r.data.tags]
    assert {r.data.tags["marin.run_id"] for r in stages} == set(ledger)
    for r in stages:
        started = ledger[r.data.tags["marin.run_id"]]
        assert r.info.run_name.split() == [started["stage"], r.data.tags["marin.run_id"][-8:]]
        assert r.data.tags["stage"] == started["stage"] and r.data.tags["status"] == "succeeded"
        assert started["recipe_digest"][7:19] == r.data.tags["recipe"]
        assert r.data.tags["mlflow.note.content"].splitlines()[0].startswith(
            f"{started['stage']} run `{r.data.tags['marin.run_id']}`: recipe {started['recipe_digest'][:19]}")
    pipeline = next(r for r in runs if r.data.tags.get("marin.kind") == "pipeline")
    commit = next(iter(ledger.values()))["code"]["git_commit"]
    assert pipeline.info.run_name == f"pipeline {commit[:8]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# MLflow 3's job runner (GenAI scorers, trace archival) is 7 more processes, ~16 CPU s each time a
# server starts, beside the stage under test on 2 cores; marin uses none of it.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class Server:
    """A real `mlflow server` on 127.0.0.1 with a SQLite backend (or ``backend``: a team's PostgreSQL,
    with ``artifacts`` on S3 and ``env`` saying where the S3 server is: tests/test_team.py)."""

    def __init__(self, workdir: Path, backend: str | None = None, artifacts: str | None = None,
                 env: dict[str, str] | None = None):
        self.workdir, self.port, self.proc = workdir, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"
        self.backend = backend or f"sqlite:///{self.workdir / 'server.db'}"
        self.artifacts, self.extra_env = artifacts or str(self.workdir / "artifacts"), env or {}

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", self.backend, "--artifacts-destination", self.artifacts],
            cwd=self.workdir, env={**env_for_subprocess(), **NO_JOBS, **self.extra_env}, stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "server.log", "ab"))  # noqa: SIM115 (the server's, for as long as it runs)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("mlflow server did not come up")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def rest(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.uri}/api/2.0/mlflow/{path}", timeout=30) as r:
            return json.loads(r.read())


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "server")
    s.start()
    yield s
    s.stop()


def test_server_stopped_during_a_stage_then_sync_catches_up(trained, server) -> None:
    # live metrics off: this is the end-of-stage sync's test (tests/test_team.py stops a server under them)
    trained.env.update(MARIN_MLFLOW="on", MLFLOW_TRACKING_URI=server.uri, MARIN_MLFLOW_LIVE="off")
    trained.marin("mlflow", "sync", check=True)  # the server has the history so far
    before = {r[0]["run_id"] for r in trained.runs()}
    params = trained.params
    params["train"]["steps"] = 40
    trained.write_params(params)
    proc = subprocess.Popen([str(BIN / "python"), "-m", "pipeline.train"], cwd=trained.root,
                            env={**env_for_subprocess(), **trained.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not ({r[0]["run_id"] for r in trained.runs()} - before) and proc.poll() is None:
        time.sleep(0.05)
    server.stop()  # MLflow goes away while the stage runs
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    warnings = [line for line in err.splitlines() if "MLflow not updated" in line]
    assert len(warnings) == 1 and server.uri in warnings[0]
    new_run = ({r[0]["run_id"] for r in trained.runs()} - before).pop()
    down = subprocess.run([str(BIN / "python"), "-m", "marin.cli", "mlflow", "sync"], cwd=trained.root,
                          env={**env_for_subprocess(), **trained.env}, capture_output=True, text=True,
                          timeout=120)  # one line, not MLflow's default retries with backoff (minutes)
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and server.uri in down.stderr, down.stderr

    server.start()
    r = trained.marin("mlflow", "sync", check=True)
    assert "1 run(s) created" in r.stdout
    found = server.rest("runs/search", {"experiment_ids": [server.get("experiments/get-by-name?experiment_name=marin")
                                                          ["experiment"]["experiment_id"]],
                                        "filter": f"tags.`marin.run_id` = '{new_run}'"})["runs"]
    assert len(found) == 1
    recorded = [x for x in trained.runs("train")[-1] if x["kind"] == "metric"]
    metric_keys = {m["key"] for m in found[0]["data"]["metrics"]}
    assert {"loss", "lr", "grad_norm"} <= metric_keys and len(recorded) == 20
    assert "0 updated" in trained.marin("mlflow", "sync", check=True).stdout.replace("0 run(s) created, ", "")


def lineage_from_rest(server: Server) -> dict:
    """Reconstruct the final model's lineage from MLflow's REST API alone."""
    exp = server.get("experiments/get-by-name?experiment_name=marin")["experiment"]["experiment_id"]
    runs = server.rest("runs/search", {"experiment_ids": [exp], "max_results": 1000})["runs"]

    def tags(r):
        return {t["key"]: t["value"] for t in r["data"].get("tags", [])}

    producers = {v: r for r in runs for k, v in tags(r).items() if k.startswith("marin.output.")}
    models = server.rest("logged-models/search", {"experiment_ids": [exp]})["models"]
    model_tags = {t["key"]: t["value"] for t in models[0]["info"]["tags"]}
    chain, frontier, seen = [], [producers[model_tags["marin.output_digest"]]], set()
    while frontier:
        run = frontier.pop()
        t = tags(run)
        if t["marin.run_id"] in seen:
            continue
        seen.add(t["marin.run_id"])
        inputs = [{x["key"]: x["value"] for x in d.get("tags", [])}["marin.digest"]
                  for d in run.get("inputs", {}).get("dataset_inputs", [])]
        chain.append({"run_id": t["marin.run_id"], "stage": t["marin.stage"], "commit": t["mlflow.source.git.commit"],
                      "recipe": t["marin.recipe_digest"], "inputs": sorted(inputs),
                      "params": {p["key"]: p["value"] for p in run["data"].get("params", [])}})
        frontier.extend(producers[d] for d in inputs if d in producers)
    return {"model_tensor_digest": model_tags["marin.tensor_digest"], "chain": chain}


def test_audit_lineage_over_rest_agrees_with_the_ledger(trained, server) -> None:
    trained.env.update(MLFLOW_TRACKING_URI=server.uri)
    trained.marin("mlflow", "sync", check=True)
    audit = lineage_from_rest(server)
    stages = [c["stage"] for c in audit["chain"]]
    assert stages == ["train", "tokenize", "curate", "fetch"]
    ledger = {recs[0]["run_id"]: recs for recs in trained.runs()}
    for c in audit["chain"]:
        started = ledger[c["run_id"]][0]["body"]
        assert c["recipe"] == started["recipe_digest"] and c["commit"] == started["code"]["git_commit"]
        ledger_inputs = sorted(x["body"]["digest"] for x in ledger[c["run_id"]] if x["kind"] == "input")
        assert c["inputs"] == ledger_inputs
    train = next(c for c in audit["chain"] if c["stage"] == "train")
    assert train["params"]["seeds.root"] == str(trained.params["seed"])
    assert train["params"]["train.lr"] == json.dumps(trained.params["train"]["lr"])
    fetch = next(c for c in audit["chain"] if c["stage"] == "fetch")
    assert fetch["inputs"] == ["sha256:" + trained.params["fetch"]["sources"][0]["sha256"]]
    # ... and `marin lineage` of the model names exactly these runs.
    prov = json.loads(trained.marin("lineage", "models/final", "--format", "prov-json", check=True).stdout)
    assert {a.split(":", 1)[1] for a in prov["activity"]} == {c["run_id"] for c in audit["chain"]}
    text = trained.marin("lineage", "models/final", check=True).stdout
    assert all(c["run_id"] in text for c in audit["chain"])


@pytest.fixture(scope="module")
def released(tmp_path_factory, _trained):
    """The trained project exported and reported (a release), mirrored into a real `mlflow server`
    (SQLite, artifacts served by the server) by `marin mlflow sync`: (project, server, the sync's stdout)."""
    proj = copy_project(_trained, tmp_path_factory.mktemp("released") / "proj")
    proj.stage("export")
    proj.stage("report")
    srv = Server(tmp_path_factory.mktemp("released-server"))
    srv.start()
    proj.env.update(MLFLOW_TRACKING_URI=srv.uri)
    out = proj.marin("mlflow", "sync", check=True).stdout
    yield proj, srv, out
    srv.stop()


def test_a_released_model_loads_from_mlflow_as_pyfunc_and_as_transformers(released, tmp_path) -> None:
    """The trained model is a pyfunc model that generates with JAX as the evaluate stage sampled, with
    params (max_new_tokens, temperature, seed); the export loads with MLflow's transformers flavor; the
    report run registers the train run's LoggedModel (mlflow.register_model: the version's run is the
    train run) and holds the report's files; eval results are metrics named eval/<task>/<metric>, the
    counts and the tasks' constants params; the runs say who made them and from what."""
    import mlflow
    from transformers import pipeline

    trained, srv, out = released
    client, exp = store(trained, srv.uri)
    assert f"open {srv.uri}/#/experiments/{exp}?workflowType=machine_learning" in out  # the training view
    mlflow.set_tracking_uri(srv.uri)
    models = {m.model_type: m for m in client.search_logged_models(experiment_ids=[exp])}
    assert set(models) == {"marin-decoder", "transformers"}

    sample = next(x["body"]["samples"][0] for recs in trained.runs("evaluate") for x in recs
                  if x["kind"] == "eval" and x["body"]["name"] == "greedy_samples")
    name = trained.params["report"]["model_name"]
    pyfunc = mlflow.pyfunc.load_model(f"models:/{name}/1")  # the registered version: the train run's model
    assert pyfunc.metadata.get_params_schema().to_dict() == [
        {"name": "max_new_tokens", "type": "long", "default": 40, "shape": None},
        {"name": "temperature", "type": "double", "default": 0.0, "shape": None},
        {"name": "seed", "type": "long", "default": 0, "shape": None}]
    n = len(sample["token_ids"])
    assert pyfunc.predict([sample["prompt"]], params={"max_new_tokens": n}) == [sample["completion"]]
    five = pyfunc.predict([sample["prompt"]], params={"max_new_tokens": 5})
    assert five != pyfunc.predict([sample["prompt"]], params={"max_new_tokens": n})  # the param is honoured
    hot = {"max_new_tokens": n, "temperature": 5.0, "seed": 1}
    assert pyfunc.predict([sample["prompt"]], params=hot) == pyfunc.predict([sample["prompt"]], params=hot)
    assert pyfunc.predict([sample["prompt"]], params=hot) != [sample["completion"]]  # sampled, not greedy

    hf_uri = f"models:/{models['transformers'].model_id}"
    pipe = mlflow.transformers.load_model(hf_uri)
    local = pipeline("text-generation", model=str(trained.root / "models/hf"))
    want = local("ROMEO.", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert pipe("ROMEO.", max_new_tokens=5, do_sample=False)[0]["generated_text"] == want
    # its pyfunc form: the prompt and the continuation, stripped (MLflow's text-generation output)
    assert mlflow.pyfunc.load_model(hf_uri).predict(["ROMEO."], params={"max_new_tokens": 5}) == [want.strip()]
    hf = Path(mlflow.artifacts.download_artifacts(artifact_uri=models["transformers"].artifact_location,
                                                  dst_path=str(tmp_path / "hf")))
    from huggingface_hub import ModelCard

    assert (hf / "model_card.md").read_text() == ModelCard.load(trained.root / "models/hf/README.md").text

    runs = {r.data.tags.get("marin.stage", "pipeline"): r for r in client.search_runs([exp])}
    [version] = client.search_model_versions(f"name = '{name}'")
    assert version.run_id == runs["train"].info.run_id == models["marin-decoder"].source_run_id
    assert version.tags["marin.run_id"] == runs["report"].data.tags["marin.run_id"]  # the release that made it
    linked = json.loads(client.get_logged_model(models["marin-decoder"].model_id).tags["mlflow.modelVersions"])
    assert [(v["name"], str(v["version"])) for v in linked] == [(name, "1")]  # what the LoggedModel page reads
    md = Path(client.download_artifacts(runs["report"].info.run_id, "report/report.md", str(tmp_path / "rep")))
    assert md.read_bytes() == (trained.root / "reports" / name / "report.md").read_bytes()

    ev = runs["evaluate"]
    recorded = {x["body"]["name"]: x["body"] for recs in trained.runs("evaluate") for x in recs
                if x["kind"] == "eval" and "corpus" not in x["body"]}
    assert ev.data.metrics["eval/validation/bits_per_byte"] == recorded["model"]["values"]["bits_per_byte"]["value"]
    assert ev.data.params["eval/validation/tokens"] == str(recorded["model"]["values"]["tokens"])  # a count
    tasks = [k.removeprefix("harness:") for k in recorded if k.startswith("harness:")]
    assert tasks
    for task in tasks:
        values = recorded[f"harness:{task}"]["values"]
        assert ev.data.metrics[f"eval/{task}/acc"] == values["acc"]["value"]
        assert ev.data.metrics[f"eval/{task}/unigram/acc"] == recorded[f"unigram:{task}"]["values"]["acc"]["value"]
        assert ev.data.params[f"eval/{task}/chance/acc"] == json.dumps(values["chance/acc"]["value"])  # a constant
        assert ev.data.params[f"eval/{task}/num_fewshot"] == str(values["num_fewshot"])
        assert f"eval/{task}/chance/acc" not in ev.data.metrics and f"eval/{task}/num_fewshot" not in ev.data.metrics
    assert all(k.startswith("eval/") and ":" not in k for k in ev.data.metrics), sorted(ev.data.metrics)
    for stage in ("train", "evaluate", "report"):
        assert runs[stage].data.tags["mlflow.user"] and runs[stage].data.tags["mlflow.source.name"]
    parent = client.get_run(runs["train"].data.tags["mlflow.parentRunId"])
    assert parent.info.end_time >= runs["train"].info.end_time > parent.info.start_time


TEXT = "document.body ? {busy: document.querySelectorAll('[class*=\"-spin-spinning\"], [class*=\"-skeleton\"]')" \
       ".length, text: document.body.innerText.split('\\n').map(s => s.trim()).filter(s => s)} : null"


def test_the_ui_shows_the_trained_model_registered_as_version_1(released, tmp_path) -> None:
    """MLflow's own UI in headless Chromium: the train run's LoggedModel page lists the registered
    model's version 1 (what `mlflow.register_model` links and `create_model_version` did not), and so
    does the Models list's "Registered models" column."""
    import numpy as np
    from PIL import Image

    from tests.browser import Browser

    trained, srv, _ = released
    client, exp = store(trained, srv.uri)
    [model] = [m for m in client.search_logged_models(experiment_ids=[exp]) if m.model_type == "marin-decoder"]
    name = trained.params["report"]["model_name"]
    url = f"{srv.uri}/#/experiments/{exp}/models/{model.model_id}?workflowType=machine_learning"
    shot = Path(os.environ.get("MARIN_SCREENSHOT_DIR", tmp_path)) / "mlflow-model-registered.png"
    with Browser(tmp_path / "profile") as browser:
        browser.open(url)
        state = browser.wait(TEXT, lambda s: bool(s) and s["busy"] == 0 and "Model versions" in s["text"],
                             timeout=180)
        browser.screenshot(shot)
        browser.open(f"{srv.uri}/#/experiments/{exp}/models?workflowType=machine_learning")  # the Models list
        listed = browser.wait(TEXT, lambda s: bool(s) and s["busy"] == 0 and "Registered models" in s["text"]
                              and model.name in s["text"], timeout=180)["text"]
    # the list's "Registered models" column: one model registered, as version 1 of the release's name
    assert listed[listed.index("v1") - 1] == name and listed.count("v1") == 1, listed
    text = state["text"]
    assert model.name in text and "Source run" in text  # the LoggedModel's own page
    at = text.index("Model versions")
    assert text[at + 1 : at + 3] == [name, "v1"] and text.count("v1") == 1, text[at : at + 5]  # registered, once
    assert "Not registered" not in text
    src = text.index("Source run ID")  # the About section: Source run, its name, Source run ID
    assert text[src - 1] == f"train {trained.runs('train')[0][0]['run_id'][-8:]}"  # made by the train run
    assert np.asarray(Image.open(shot).convert("RGB")).astype(int).std() > 10, "blank page"


def test_a_moved_project_never_logs_into_the_originals_artifacts(trained, tmp_path) -> None:
    trained.marin("mlflow", "sync", check=True)
    before = sorted(p.relative_to(trained.root).as_posix() for p in (trained.root / "mlartifacts").rglob("*"))
    moved = Project(tmp_path / "moved")
    shutil.copytree(trained.root, moved.root, symlinks=True)
    r = moved.marin("mlflow", "sync")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert f"keeps artifacts in {(trained.root / 'mlartifacts').resolve().as_uri()}" in r.stderr
    assert "remove mlflow.db and mlartifacts/ and run `marin mlflow sync`" in r.stderr
    assert sorted(p.relative_to(trained.root).as_posix() for p in (trained.root / "mlartifacts").rglob("*")) == before
