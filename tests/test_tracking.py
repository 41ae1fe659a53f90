"""The MLflow view: real MLflow on SQLite, and a real `mlflow server` on 127.0.0.1."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import BIN, Project, copy_project, env_for_subprocess
from tests.servers import MlflowServer as Server

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
