"""A release in MLflow: the trained model registered from its train run, loaded back as pyfunc and with
MLflow's transformers flavor from a real `mlflow server`, and shown registered in the real UI (Chromium)."""

import json
import os
from pathlib import Path

import pytest

from tests.conftest import copy_project
from tests.servers import MlflowServer as Server
from tests.test_tracking import store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def released(tmp_path_factory, _trained_project):
    """The trained project exported and reported (a release), mirrored into a real `mlflow server`
    (SQLite, artifacts served by the server) by `marin mlflow sync`: (project, server, the sync's stdout)."""
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("released") / "proj")
    proj.git("commit", "-qam", "the tiny model's params")  # a release: a report on a clean commit of the main branch
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
    licence = ModelCard.load(trained.root / "models/hf/README.md").data.license
    assert licence and (hf / "LICENSE.txt").read_text().startswith(f"License: {licence},")
    assert "huggingface.co" not in (hf / "LICENSE.txt").read_text()  # no page of a repository that is not ours

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


def test_the_flavor_is_written_with_the_hub_out_of_reach_and_the_setting_put_back(monkeypatch) -> None:
    """MLflow's save_model asks the Hub for the licence of the repository a pipeline names, which for a
    local export is its folder: inside ``hub_offline`` huggingface_hub refuses every request at once
    (no retries, no request about another repository), and outside it the user's setting is back."""
    from huggingface_hub import constants, list_repo_files
    from huggingface_hub.errors import OfflineModeIsEnabled

    from marin.hub import hub_offline

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1"
        with pytest.raises(OfflineModeIsEnabled):
            list_repo_files("models/hf")
    assert constants.HF_HUB_OFFLINE is False and "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with hub_offline():
        pass
    assert os.environ["HF_HUB_OFFLINE"] == "0"
