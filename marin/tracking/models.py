"""The model outputs of a ledger as MLflow LoggedModels: one per output digest, linked to the
run that made it and to every run that read it. The trained model (output ``model``) is a
``pyfunc`` model that generates with JAX (``marin.tracking.pyfunc``); its Hugging Face export
(output ``hf_model``) is logged beside it with MLflow's transformers flavor
(``marin.tracking.hf_flavor``: ``mlflow.transformers.load_model`` loads it). Stages syncing at the
same moment may each make one; the earliest made stays and the others delete theirs, so every
stage links to the same one. A release (a report run on a clean commit of the main branch:
:mod:`marin.report.release`) registers the trained model's LoggedModel with ``mlflow.register_model``,
as MLflow's users do, and moves the alias ``release`` to it: the version's run is the train run, and
the LoggedModel's page lists its versions."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin import hashing, readers
from marin.ledger.records import Record
from marin.ledger.store import RunLog

HF_FILES = "hf-files"  # an export logged as its files: MLflow's transformers flavor could not be logged
RELEASE_ALIAS = "release"  # models:/<name>@release: the latest release
REGISTRY_NOTE = ("Releases of {name}: one version per release, a report built on a clean commit of the main branch "
                 "(or with report.register: true), each the train run's model; the alias `release` names the latest. "
                 "Experiments (dvc exp run, marin sweep, other branches) stay LoggedModels of the experiment.")


def release_of(log: RunLog) -> dict[str, Any]:
    """A report run's release decision as its run.started records it; {} for any other run (or one made
    before marin recorded it: never registered)."""
    return (log.start.body.get("execution") or {}).get("release") or {}


class LoggedModels:
    def __init__(self, client: Any, experiment_id: str, root: Path):
        self.client, self.exp, self.root = client, experiment_id, root
        self._ids: dict[str, str | None] = {}  # model output digest -> LoggedModel id, looked up when needed

    def id(self, digest: str) -> str | None:
        """The LoggedModel id of a model output digest, or None when MLflow has none yet."""
        if digest not in self._ids:
            first = self._first(digest)
            self._ids[digest] = first.model_id if first else None
        return self._ids[digest]

    def _first(self, digest: str) -> Any:
        """The earliest LoggedModel made for ``digest``, looked for again after a second while
        any is pending (its maker has not yet kept or deleted it)."""
        from mlflow.entities import LoggedModelStatus

        def search() -> list[Any]:
            return self.client.search_logged_models(
                experiment_ids=[self.exp], filter_string=f"tags.`marin.output_digest` = '{digest}'", max_results=50)

        found = search()
        if any(m.status != LoggedModelStatus.READY for m in found):
            time.sleep(1.0)
            found = search()
        return min(found, key=lambda m: (m.creation_timestamp, m.model_id)) if found else None

    def log_output(self, mlflow_id: str, log: RunLog, r: Record) -> None:
        """The LoggedModel of a run's model output record, made (with its files) unless MLflow has it."""
        b = r.body
        if self.id(b["digest"]):
            return
        model = self._create(mlflow_id, log, r)
        # Ours is pending, so this waits until a model another stage made at the same moment is
        # visible too: the earliest one stays.
        first = self._first(b["digest"]) or model
        if first.model_id != model.model_id:
            self.client.delete_logged_model(model.model_id)
            self._ids[b["digest"]] = first.model_id
            return
        self._complete(mlflow_id, model.model_id, r)

    def _create(self, mlflow_id: str, log: RunLog, r: Record) -> Any:
        """A pending LoggedModel for a model output record, typed as what its files will be: the export is
        ``transformers`` only where the flavor can be logged, else ``hf-files`` (MLflow cannot load it)."""
        from marin.tracking import hf_flavor

        b = r.body
        path, config, hf = self._source(b)
        flavored = hf_flavor.available() and self._intact(path, config, hf, b)
        return self.client.create_logged_model(
            self.exp, name=f"marin-{'hf-' if hf else ''}{log.run_id}", source_run_id=mlflow_id,
            model_type=("transformers" if flavored else HF_FILES) if hf else "marin-decoder",
            params={k: str(v) for k, v in config.get("model", {}).items()},
            tags={"marin.run_id": log.run_id, "marin.output_digest": b["digest"], "marin.folder_digest": b["digest"],
                  "marin.tensor_digest": b.get("tensor_digest", ""), "marin.location": path.resolve().as_uri(),
                  "marin.recipe_digest": log.recipe_digest})

    def _complete(self, mlflow_id: str, model_id: str, r: Record) -> None:
        """The LoggedModel's files uploaded, the model marked ready and linked to its run as an output."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        b = r.body
        path, config, hf = self._source(b)
        self._files(model_id, path, b, config, hf)
        self.client.finalize_logged_model(model_id, LoggedModelStatus.READY)
        self.client.log_outputs(mlflow_id, [LoggedModelOutput(model_id, b.get("meta", {}).get("step", 0))])
        self._ids[b["digest"]] = model_id

    def _source(self, b: dict[str, Any]) -> tuple[Path, dict[str, Any], bool]:
        """(the model's folder, its config.json or {}, whether it is the Hugging Face export)."""
        path = self.root / b["path"]
        config = readers.read_json(path / "config.json", "config") if (path / "config.json").is_file() else {}
        return path, config, b["name"] == "hf_model"

    def _intact(self, path: Path, config: dict[str, Any], hf: bool, b: dict[str, Any]) -> bool:
        """Whether the folder on disk (and the trained model's tokenizer) is the recorded version."""
        tok = self.root / config.get("tokenizer", {}).get("path", "data/tokens/tokenizer.json")
        return path.is_dir() and hashing.path_digest(path) == b["digest"] and (
            hf or (tok.is_file() and hashing.file_digest(tok) == config.get("tokenizer", {}).get("digest")))

    def upgrade(self) -> list[str]:
        """Exports logged as files only (``hf-files``: the hf group was absent) logged again with the transformers
        flavor, now that it can be: a new LoggedModel linked to the export run, the files-only one deleted.
        The ledger run ids of those upgraded."""
        from marin.ledger.store import load_run
        from marin.tracking import hf_flavor

        if not hf_flavor.available():
            return []
        done = []
        files_only = self.client.search_logged_models(
            experiment_ids=[self.exp], filter_string=f"model_type = '{HF_FILES}'", max_results=100)
        for old in files_only:
            digest, run_id = old.tags.get("marin.output_digest", ""), old.tags.get("marin.run_id", "")
            log = load_run(self.root, run_id, validate=False)
            r = next((r for r in log.records if r.kind == "output" and r.body["digest"] == digest), None)
            if r is None or not self._intact(*self._source(r.body), r.body):
                continue  # the export on disk is no longer the logged one: it stays as it is
            model = self._create(old.source_run_id, log, r)
            self._complete(old.source_run_id, model.model_id, r)
            self.client.delete_logged_model(old.model_id)
            done.append(run_id)
        return done

    def _files(self, model_id: str, path: Path, b: dict[str, Any], config: dict[str, Any], hf: bool) -> None:
        """The model's files as the LoggedModel's artifacts, when the copy on disk is the recorded
        one (a later run may have replaced it: then a tag says so): the export's files as they are,
        the trained model as a pyfunc model with the very tokenizer it was trained with."""
        from marin.tracking import pyfunc

        tok = self.root / config.get("tokenizer", {}).get("path", "data/tokens/tokenizer.json")
        if not self._intact(path, config, hf, b):
            self.client.set_logged_model_tags(model_id, {"marin.files": f"not uploaded: {b['path']} or its "
                                                                      "tokenizer on disk is not the recorded version"})
            return
        from marin.tracking import hf_flavor

        note = None
        with tempfile.TemporaryDirectory(prefix="marin-model-") as tmp:
            src = Path(tmp) / "model"
            if hf and hf_flavor.available():
                hf_flavor.save(src, path)
            elif hf:  # the export's files as the Hub gets them; the flavor needs the hf group
                src.mkdir()
                for f in sorted(path.iterdir()):
                    if f.is_file():
                        shutil.copyfile(f, src / f.name)
                note = ("files only (model type hf-files): MLflow's transformers flavor needs transformers and torch; "
                        "`uv sync --group hf`, then `marin mlflow sync` logs it with the flavor")
            else:
                pyfunc.save(src, path, tok)
            files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
            self.client.log_model_artifacts(model_id, str(src))
        self.client.set_logged_model_tags(model_id, {"marin.files": ", ".join(files), **({"marin.flavor": note}
                                                                                          if note else {})})

    def register(self, log: RunLog, report: dict[str, Any]) -> None:
        """A release registers its model: ``mlflow.register_model`` of the train run's LoggedModel as a new
        version of the registered model named after the report (params.yaml: report.model_name), given the
        alias ``release``. Only a report run whose run.started says it is a release (``execution.release``:
        :mod:`marin.report.release`); the version's run is the train run, its tags name the report run."""
        import mlflow
        from mlflow.exceptions import MlflowException

        if not release_of(log).get("register"):
            return  # an experiment: its model stays a LoggedModel
        name = report["meta"]["model_name"]
        train = next((s["run_id"] for s in report["doc"]["lineage"] if s["stage"] == "train"), None)
        found = self.client.search_logged_models(
            experiment_ids=[self.exp], filter_string=f"tags.`marin.run_id` = '{train}'", max_results=50)
        model = next((m for m in found if m.model_type == "marin-decoder"), None)
        if model is None:
            return
        if self.client.search_model_versions(f"name = '{name}' and tags.`marin.run_id` = '{log.run_id}'"):
            return  # this release is registered
        with _tracking(self.client.tracking_uri):
            try:
                self.client.create_registered_model(name, description=REGISTRY_NOTE.format(name=name))
            except MlflowException as e:
                if "ALREADY_EXISTS" not in str(e.error_code):
                    raise
            with contextlib.redirect_stderr(io.StringIO()):  # "Created version ...": a stage's output is its own
                version = mlflow.register_model(f"models:/{model.model_id}", name, tags={
                    "marin.run_id": log.run_id, "marin.version": report["meta"]["version"],
                    "marin.release": release_of(log)["why"],
                    "marin.tensor_digest": model.tags.get("marin.tensor_digest", "")})
        self.client.set_registered_model_alias(name, RELEASE_ALIAS, version.version)
        self._one_entry_per_version(model.model_id)

    def _one_entry_per_version(self, model_id: str) -> None:
        """MLflow 3.17 against a server lists a new version twice in the LoggedModel's mlflow.modelVersions
        tag (the server adds version "1", ``register_model`` then 1): kept once each."""
        key = "mlflow.modelVersions"
        listed = json.loads(self.client.get_logged_model(model_id).tags.get(key) or "[]")
        once = list({(v["name"], str(v["version"])): {**v, "version": str(v["version"])} for v in listed}.values())
        if once != listed:
            self.client.set_logged_model_tags(model_id, {key: json.dumps(once)})


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to ``uri`` for a fluent call (``register_model`` has no client
    form that links the LoggedModel to its version), and put back after it, with the environment
    variable MLflow sets beside it."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    was, env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")  # pyright: ignore[reportPrivateUsage]
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(was)  # pyright: ignore[reportArgumentType]
        if env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env
