"""MLflow's registry as a release log, against a real `mlflow server` (issue 57, item 3): on a copy of the
shipped `dvc repro`, committed as the README's baseline step commits it, `marin mlflow sync` by a Python
without the hf group logs the export as files (typed hf-files), a later `marin mlflow sync` with it logs
the transformers flavor; `marin report` on the clean commit registers one version with the alias release,
and a `dvc exp run` registers nothing, its runs under a parent run named after the experiment."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import BIN, Project, copy_project
from tests.servers import MlflowServer
from tests.test_experiments import readme_baseline
from tests.test_tracking import store

pytestmark = pytest.mark.slow

EXP = "rel-exp"
HF_GROUP = ("torch", "transformers", "accelerate")  # pyproject.toml's hf group


def without_hf(dest: Path) -> Path:
    """A folder of links to this environment's packages but the hf group's: on PYTHONPATH under ``python -S``,
    a Python in which transformers and torch are not installed, as in a clone synced without the group."""
    dest.mkdir()
    for p in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if p.name.split("-")[0].split(".")[0] not in HF_GROUP and p.suffix != ".pth":
            (dest / p.name).symlink_to(p)
    return dest


def hf_model(client, exp: str, digest: str):
    [m] = [m for m in client.search_logged_models(experiment_ids=[exp]) if m.tags["marin.output_digest"] == digest]
    return m


@pytest.fixture(scope="module")
def registry(tmp_path_factory, _shipped):
    """(project, server, what each step printed, the export's LoggedModel before the upgrade and the error
    MLflow's transformers flavor gave loading it)."""
    import mlflow

    base = tmp_path_factory.mktemp("registry")
    proj = copy_project(_shipped[0], base / "proj")
    srv = MlflowServer(base / "server")
    srv.start()
    proj.env.update(MLFLOW_TRACKING_URI=srv.uri, MARIN_MLFLOW="on")
    proj.run("bash", "-c", readme_baseline(), check=True)  # the commit `marin report` and `dvc exp run` start from
    out = {"no_hf": Project(proj.root, {**proj.env, "PYTHONPATH": str(without_hf(base / "no-hf"))}).run(
        str(BIN / "python"), "-S", "-m", "marin.cli", "mlflow", "sync", check=True).stdout}
    client, exp = store(proj, srv.uri)
    before = hf_model(client, exp, export_digest(proj))
    mlflow.set_tracking_uri(srv.uri)
    try:
        mlflow.transformers.load_model(f"models:/{before.model_id}")
        failed = None
    except Exception as e:  # what a user of the files-only model gets
        failed = str(e)
    out["sync"] = proj.marin("mlflow", "sync", check=True).stdout
    out["report"] = proj.marin("report", check=True).stdout
    p = proj.dvc("exp", "run", "-n", EXP, "-S", "+report.version='0.2'", "report")
    out["exp"] = p.stdout + p.stderr
    yield proj, srv, out, before, failed
    srv.stop()


def export_digest(proj: Project) -> str:
    """The shipped run's export (its first export run's hf_model output)."""
    run = proj.runs("export")[0]
    return next(x["body"]["digest"] for x in run if x["kind"] == "output" and x["body"]["name"] == "hf_model")


def report_runs(proj: Project) -> dict[str, dict]:
    """Each report run's id -> its run.started execution."""
    return {recs[0]["run_id"]: recs[0]["body"].get("execution", {}) for recs in proj.runs("report")}


def test_only_releases_are_registered_and_the_alias_names_the_latest(registry) -> None:
    """`marin report` on the clean baseline commit is a release: one new version, aliased release; the `dvc
    exp run` that rebuilt the report registered nothing and says why, in the ledger and in MLflow."""
    proj, srv, out, _, _ = registry
    client, exp = store(proj, srv.uri)
    runs = report_runs(proj)
    mine = next(r for r, ex in runs.items() if "dvc_experiment" not in ex and r in out["report"])
    [in_exp] = [r for r, ex in runs.items() if ex.get("dvc_experiment", {}).get("name") == EXP]
    assert runs[mine]["release"]["register"] is True and "of master" in runs[mine]["release"]["why"]
    assert "report: a release (a clean commit" in out["report"] and "alias release" in out["report"]
    assert runs[in_exp]["release"] == {"register": False, "why": f"a run of DVC experiment {EXP} (`dvc exp run`)"}
    assert f"not a release (a run of DVC experiment {EXP}" in out["exp"]

    name = proj.params["report"]["model_name"]
    versions = client.search_model_versions(f"name = '{name}'")
    registered = [v.tags["marin.run_id"] for v in versions]
    assert sorted(registered) == sorted(r for r, ex in runs.items() if ex.get("release", {}).get("register"))
    assert registered.count(mine) == 1 and in_exp not in registered
    latest = client.get_model_version_by_alias(name, "release")
    assert latest.tags["marin.run_id"] == mine and latest.version == str(max(int(v.version) for v in versions))
    train = client.search_runs([exp], filter_string="tags.`marin.stage` = 'train'")
    assert {v.run_id for v in versions} <= {r.info.run_id for r in train}  # each version is a train run's model
    tags = {r.data.tags["marin.run_id"]: r.data.tags.get("marin.release") for r in
            client.search_runs([exp], filter_string="tags.`marin.stage` = 'report'")}
    assert tags[in_exp].startswith("not registered: a run of DVC experiment") and tags[mine].startswith("registered: ")
    assert "Experiments (dvc exp run" in client.get_registered_model(name).description


def test_the_experiment_names_its_parent_run_and_pipelines_carry_headline_scores(registry) -> None:
    """A DVC user finds the experiment by its name: the tag dvc_experiment on its runs, and the name of
    their parent run. The baseline's parent run carries the evaluation's headline scores."""
    proj, srv, _, _, _ = registry
    client, exp = store(proj, srv.uri)
    tagged = client.search_runs([exp], filter_string=f"tags.`dvc_experiment` = '{EXP}'")
    [parent] = [r for r in tagged if r.data.tags["marin.kind"] == "pipeline"]
    assert parent.info.run_name == EXP
    assert {r.data.tags["marin.stage"] for r in tagged if r is not parent} == {"export", "report"}
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in tagged if r is not parent)

    evaluate = client.search_runs([exp], filter_string="tags.`marin.stage` = 'evaluate'")[0]
    home = client.get_run(evaluate.data.tags["mlflow.parentRunId"])
    recorded = json.loads((proj.root / "metrics/eval.json").read_text())
    assert home.data.metrics["eval/validation/bits_per_byte"] == recorded["bits_per_byte"]
    for task, scores in recorded["harness"].items():
        [(metric, value)] = scores.items()  # the metrics file holds each task's headline only
        assert home.data.metrics[f"eval/{task}/{metric}"] == value
    assert not [k for k in home.data.metrics if "stderr" in k or "unigram" in k]


def test_a_files_only_export_is_typed_as_such_until_sync_logs_the_flavor(registry) -> None:
    """Synced without the hf group, the export is an hf-files LoggedModel that says why and how to fix it,
    which MLflow's transformers flavor cannot load; `marin mlflow sync` with the group logs the flavor (one
    transformers LoggedModel in its place, linked to the export run), and then it loads and generates as
    the export folder does."""
    import mlflow
    from transformers import pipeline

    proj, srv, out, before, failed = registry
    client, exp = store(proj, srv.uri)
    assert before.model_type == "hf-files" and "uv sync --group hf" in before.tags["marin.flavor"]
    assert failed is not None and "MLmodel" in failed, failed
    export_run = proj.runs("export")[0][0]["run_id"]
    assert "files-only export(s) logged with the transformers flavor" in out["sync"] and export_run in out["sync"]
    after = hf_model(client, exp, export_digest(proj))
    assert after.model_type == "transformers" and "marin.flavor" not in after.tags
    assert after.source_run_id == before.source_run_id
    assert after.model_id in {o.model_id for o in client.get_run(after.source_run_id).outputs.model_outputs}
    mlflow.set_tracking_uri(srv.uri)
    pipe = mlflow.transformers.load_model(f"models:/{after.model_id}")
    local = pipeline("text-generation", model=str(proj.root / "models/hf"))
    assert (pipe("ROMEO.", max_new_tokens=5, do_sample=False)[0]["generated_text"]
            == local("ROMEO.", max_new_tokens=5, do_sample=False)[0]["generated_text"])


def test_the_harness_samples_are_the_evaluate_runs_evaluation_table(registry) -> None:
    """lm-eval's samples.jsonl as an MLflow table (load_table): a row per task and document, with the
    per-sample metrics lm-eval recorded."""
    import mlflow

    proj, srv, _, _, _ = registry
    client, exp = store(proj, srv.uri)
    [evaluate] = client.search_runs([exp], filter_string="tags.`marin.stage` = 'evaluate'")
    mlflow.set_tracking_uri(srv.uri)  # load_table searches the runs through MLflow's fluent API
    table = client.load_table(exp, "eval_results_table.json", run_ids=[evaluate.info.run_id])
    samples = [json.loads(x) for x in (proj.root / "evals/harness/samples.jsonl").read_text().splitlines()]
    assert len(table) == len(samples) and evaluate.data.tags["marin.eval_table"].startswith(
        f"eval_results_table.json: {len(samples)} of {len(samples)} samples")
    first = table.iloc[0]
    assert (first["task"], first["doc_id"], first["target"]) == (samples[0]["task"], samples[0]["doc_id"],
                                                                 samples[0]["target"])
    for metric in samples[0]["metrics"]:  # MLflow's JSON table keeps 10 significant digits (pandas' to_json)
        assert first[metric] == pytest.approx(samples[0][metric], rel=1e-9)
