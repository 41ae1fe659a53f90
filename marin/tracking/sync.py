"""``marin mlflow sync``: rebuild or complete MLflow from the ledger."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from marin import readers
from marin.errors import MarinError
from marin.ledger import mirror
from marin.ledger.index import Index
from marin.ledger.records import Record
from marin.ledger.store import RunLog, load_run
from marin.tracking.models import LoggedModels, release_of
from marin.tracking.naming import (
    EXPERIMENT_NOTE,
    PIPELINE_NOTE,
    eval_metrics,
    eval_params,
    experiment,
    flat,
    headline_metrics,
    ms,
    pipeline_key,
    pipeline_name,
    run_name,
    run_note,
    short_digest,
    short_tags,
    user,
)
from marin.tracking.outcome import SyncReport, TrackingError, default_uri

__all__ = ["SyncReport", "TrackingError", "default_uri", "sync", "sync_quietly"]

EXPERIMENT = "marin"
# MLflow 3 opens an experiment by its kind: without it the UI guesses, and a run with a LoggedModel is
# shown as GenAI "agent versions". Training runs belong in the model-training view.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
CONTEXT = {"fetch": "training", "curate": "training", "tokenize": "training", "train": "training",
           "evalsets": "evaluation", "instructions": "training", "sft": "training", "evaluate": "evaluation",
           "evaluate_instruct": "evaluation", "decontaminate": "evaluation", "trace_index": "evaluation"}
BATCH = 900  # MLflow accepts up to 1000 metrics per log_batch
CREATED = "marin.created_ns"  # when this MLflow run was made: of two made at once, the first stays


class _Syncer:
    def __init__(self, root: Path, uri: str):
        from mlflow import MlflowClient

        self.root, self.uri = root, uri
        self.client = MlflowClient(tracking_uri=uri)
        self.exp = self._experiment()
        self.models = LoggedModels(self.client, self.exp, root)
        self.known: dict[str, Any] | None = None  # every MLflow run by key, when a full sync listed them

    def lookup(self, key: str) -> Any:
        """The MLflow run for a ledger run id (or ``pipeline:<key>``): from the full listing, else one search."""
        if self.known is not None:
            return self.known.get(key)
        tag, value = ("marin.pipeline", key[9:]) if key.startswith("pipeline:") else ("marin.run_id", key)
        return self._first(tag, value)

    def list_all(self) -> None:
        """Every run of the experiment, page by page (a full sync looks at all of them anyway)."""
        self.known, token = {}, None
        while True:
            page = self.client.search_runs([self.exp], max_results=1000, page_token=token)
            for r in page:
                key = r.data.tags.get("marin.run_id") or "pipeline:" + r.data.tags.get("marin.pipeline", "")
                if key not in self.known or _made(r) < _made(self.known[key]):
                    self.known[key] = r
            token = page.token
            if not token:
                return

    def _experiment(self) -> str:
        exp = self.client.get_experiment_by_name(EXPERIMENT)
        artifacts = (self.root / "mlartifacts").resolve().as_uri() if self.uri.startswith("sqlite:") else None
        if exp is not None:
            if artifacts and exp.artifact_location.startswith("file:") and exp.artifact_location != artifacts:
                raise TrackingError(
                    f"{self.uri}: its experiment keeps artifacts in {exp.artifact_location}, not in this project's "
                    "mlartifacts/ (the project was copied or moved with its mlflow.db, which MLflow stores absolute "
                    "paths in): remove mlflow.db and mlartifacts/ and run `marin mlflow sync` to rebuild the view "
                    "from the ledger")
            if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:  # made by an older marin
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return exp.experiment_id
        try:
            return self.client.create_experiment(EXPERIMENT, artifact_location=artifacts, tags={
                "marin.project": str(self.root.name), EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1],
                "mlflow.note.content": EXPERIMENT_NOTE})
        except Exception:  # another stage created it at the same moment
            for _ in range(5):
                time.sleep(0.3)
                exp = self.client.get_experiment_by_name(EXPERIMENT)
                if exp is not None:
                    return exp.experiment_id
            raise

    def _create_once(self, tag: str, value: str, **kw: Any) -> tuple[Any, bool]:
        """Create a run tagged ``tag=value`` unless another process (a stage syncing at the same
        moment) did: of the runs with the tag, the one created first stays and a later one is
        deleted, so every process goes on with the same run. (run, created here)"""
        kw["tags"] = {**kw["tags"], CREATED: str(time.time_ns())}
        run = self.client.create_run(self.exp, **kw)
        first = self._first(tag, value, run)
        if first.info.run_id != run.info.run_id:
            self.client.delete_run(run.info.run_id)
            return first, False
        return run, True

    def _first(self, tag: str, value: str, mine: Any = None) -> Any:
        """Of the runs tagged ``tag=value`` (and ``mine``), the first made: of two made at once, it stays."""
        found = self.client.search_runs([self.exp], filter_string=f"tags.`{tag}` = '{value}'", max_results=50)
        return min([r for r in (mine, *found) if r is not None], key=_made, default=None)

    def _lost_late(self, tag: str, value: str, mine: Any) -> bool:
        """Checked again once a created run is synced: a run created a moment before it, whose
        creation was not yet visible then, wins; this one goes (the winner's process logs the
        same records)."""
        first = self._first(tag, value, mine)
        if first.info.run_id == mine.info.run_id:
            return False
        self.client.delete_run(mine.info.run_id)
        return True

    def parent(self, log: RunLog) -> str:
        code, s = log.code, log.start.body
        key = pipeline_key(s)
        found = self.lookup("pipeline:" + key)
        if found is not None and found.info.status == "RUNNING" and self.known is None:
            time.sleep(1.0)  # just made by a stage syncing now: by then it has kept or deleted it
            found = self.lookup("pipeline:" + key)
        if found is not None:
            return found.info.run_id
        run, created = self._create_once(
            "marin.pipeline", key, run_name=pipeline_name(s), start_time=ms(log.start.time),
            tags={"marin.kind": "pipeline", "marin.pipeline": key, "mlflow.source.git.commit": code["git_commit"] or "",
                  "mlflow.note.content": PIPELINE_NOTE, **_experiment_tags(s)})
        if created:
            time.sleep(0.5)  # a parent made at the same moment by another stage is visible by now
            if self._lost_late("marin.pipeline", key, run):
                run = self._first("marin.pipeline", key, run)
            else:
                self.client.set_terminated(run.info.run_id, "FINISHED", end_time=ms(log.start.time))
        if self.known is not None:
            self.known["pipeline:" + key] = run
        return run.info.run_id

    def stage_run(self, log: RunLog) -> tuple[Any, bool]:
        """The MLflow run of a ledger run, created (with its tags and params) if MLflow has none."""
        from mlflow.entities import Param

        found = self.lookup(log.run_id)
        if found is not None:
            return found, False
        s = log.start.body
        tags = {"marin.kind": "stage", "marin.run_id": log.run_id, "marin.recipe_digest": s["recipe_digest"],
                "marin.stage": s["stage"], "mlflow.source.git.commit": s["code"]["git_commit"] or "",
                "mlflow.source.name": " ".join(s["command"]), "mlflow.source.type": "LOCAL", "mlflow.user": user(),
                "marin.determinism_digest": s["determinism_digest"], "marin.code_digest": s["code"]["code_digest"],
                "mlflow.parentRunId": self.parent(log), "mlflow.note.content": run_note(log),
                **short_tags(log), **_experiment_tags(s)}
        run, created = self._create_once("marin.run_id", log.run_id, run_name=run_name(s['stage'], log.run_id),
                                         start_time=ms(log.start.time), tags=tags)
        if created:
            params = flat("", s["params"])
            params.update(flat("seeds", s["seeds"]) if s["seeds"] else {})
            params.update(flat("determinism", s["determinism_class"]))
            plist = [Param(k[:250], str(v)[:6000]) for k, v in sorted(params.items())]
            for i in range(0, len(plist), 100):  # another stage syncing this run now may insert the same param
                _racing(lambda i=i: self.client.log_batch(run.info.run_id, params=plist[i : i + 100]))
        if self.known is not None:
            self.known[log.run_id] = run
        return run, created

    def sync_run(self, log: RunLog, report: SyncReport) -> None:
        from mlflow.entities import RunTag

        last = log.records[-1]
        found = self.lookup(log.run_id)
        if found is not None and found.data.tags.get("marin.synced_digest") == last.digest:
            report.unchanged.append(log.run_id)
            return
        s = log.start.body
        run, created = (found, False) if found is not None else self.stage_run(log)
        mlflow_id, synced = run.info.run_id, int(run.data.tags.get("marin.synced_seq", "-1"))
        (report.created if created else report.updated).append(log.run_id)
        new = [r for r in log.records if r.seq > synced]
        self._inputs(mlflow_id, s["stage"], [r for r in new if r.kind == "input"])
        metrics = [m for r in new for m in self._metrics(r, log)]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(mlflow_id, metrics=metrics[i : i + BATCH])
        self._headlines(run.data.tags.get("mlflow.parentRunId"), log, new)
        counts = [p for r in new if r.kind == "eval" for p in eval_params(r)]
        for i in range(0, len(counts), 100):  # as the run's params: a concurrent sync may insert the same one
            _racing(lambda i=i: self.client.log_batch(mlflow_id, params=counts[i : i + 100]))
        for r in new:
            if r.kind == "output":
                self._output(mlflow_id, log, r, appends=found is not None or created)
        self.client.log_artifact(mlflow_id, str(log.path), "ledger")
        tags = [RunTag("marin.synced_seq", str(last.seq)), RunTag("marin.synced_digest", last.digest),
                RunTag("marin.status", log.status), RunTag("status", log.status)]
        if release := release_of(log):  # a report run: whether it is a release, and why
            tags.append(RunTag("marin.release", ("registered: " if release["register"] else "not registered: ")
                               + release["why"]))
        # Outputs as tags, so lineage can be followed in MLflow alone: input digest -> producing run.
        outputs = [r.body_as("output") for r in new if r.kind == "output"]
        tags += [RunTag("marin.output." + b["name"].replace(":", "/"), b["digest"]) for b in outputs]
        tags += [RunTag(f"marin.output.{b['name'].replace(':', '/')}.tensor_digest", b["tensor_digest"])
                 for b in outputs if "tensor_digest" in b]  # the model's second identity
        # The latest `marin verify` of this run: result, mode and the record that says so.
        tags += [t for r, v in ((r, r.body_as("verification")) for r in new if r.kind == "verification") for t in (
            RunTag("marin.verification.result", v["result"]), RunTag("marin.verification.mode", v["mode"]),
            RunTag("marin.verification.record", f"seq {r.seq} {r.digest}"))]
        self.client.log_batch(mlflow_id, tags=tags)
        if s["stage"] == "sweep":  # a `marin sweep` run: the parent of one child run per trial
            from marin.tracking.sweeps import sync_trials

            sync_trials(self.client, self.exp, mlflow_id, log.run_id,
                        [r for r in new if r.kind in ("trial", "selection")])
        if created and self._lost_late("marin.run_id", log.run_id, run):
            report.created.remove(log.run_id)
            report.updated.append(log.run_id)
            return
        if log.finished is not None:
            status = "FINISHED" if log.status == "succeeded" else "FAILED"
            self.client.set_terminated(mlflow_id, status, end_time=ms(log.finished.time))
            self._extend_parent(run.data.tags.get("mlflow.parentRunId"), ms(log.finished.time))

    def _headlines(self, parent_id: str | None, log: RunLog, new: list[Record]) -> None:
        """The pipeline run carries its evaluations' headline scores, to sort pipelines (and DVC experiments) by."""
        from mlflow.entities import Metric

        found = [Metric(k, v, ms(r.time), 0) for r in new for k, v in headline_metrics(log.stage, r).items()]
        if parent_id and found:  # two stages syncing the same record at once insert the same metric
            _racing(lambda: self.client.log_batch(parent_id, metrics=found))

    def _extend_parent(self, parent_id: str | None, end: int) -> None:
        """A pipeline run lasts until its last stage run ends (it was made with no duration)."""
        if not parent_id:
            return
        parent = self.client.get_run(parent_id)
        if parent is not None and (parent.info.end_time or 0) < end:
            self.client.set_terminated(parent_id, "FINISHED", end_time=end)

    def _inputs(self, mlflow_id: str, stage: str, records: list[Record]) -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelInput

        datasets, models = [], []
        for r in records:
            b = r.body
            if b.get("name") == "model" and (model_id := self.models.id(b["digest"])):
                models.append(LoggedModelInput(model_id))
            source = b.get("locator") or (self.root / b["path"]).resolve().as_uri()
            ds = Dataset(name=b["name"], digest=short_digest(b["digest"]), source_type="marin-ledger", source=source,
                         profile=json.dumps({"size": b["size"], "license": b.get("license")}))
            datasets.append(DatasetInput(ds, tags=[InputTag("mlflow.data.context", CONTEXT.get(stage, "training")),
                                                   InputTag("marin.digest", b["digest"]),
                                                   InputTag("marin.path", b["path"])]))
        if datasets or models:
            _racing(lambda: self.client.log_inputs(mlflow_id, datasets=datasets, models=models or None))

    def _metrics(self, r: Record, log: RunLog | None) -> list[Any]:
        """MLflow metrics of a metric record, or of an eval record linked to ``log``'s model and data."""
        from mlflow.entities import Metric

        t = ms(r.time)
        if r.kind == "metric":
            m = r.body_as("metric")
            out = [Metric(k, v["value"], t, m["step"]) for k, v in m["values"].items()]
            out += [Metric(k, v, t, m["step"]) for k, v in m.get("timing", {}).items()]
            return out
        if r.kind != "eval" or log is None:
            return []
        inputs = {i["name"]: i["digest"] for i in log.bodies("input")}
        model_id = self.models.id(inputs["model"]) if "model" in inputs else None
        tokens = inputs.get("tokens")
        link = {"model_id": model_id} if model_id else {}
        if tokens:
            link.update(dataset_name="tokens", dataset_digest=short_digest(tokens))
        return [Metric(k, v, t, 0, **link) for k, v in eval_metrics(r).items()]  # measurements; the rest are params

    def _output(self, mlflow_id: str, log: RunLog, r: Record, appends: bool = True) -> None:
        """``appends``: whether this process writes what MLflow appends to (the evaluation table), False when
        another process made the run a moment ago and is writing it."""
        b = r.body_as("output")
        path = self.root / b["path"]
        if b["name"].endswith("manifest") and path.is_file():
            self.client.log_artifact(mlflow_id, str(path), "manifests")
        if b["name"] == "trace_samples" and path.is_file():  # the samples traced to their training documents
            self.client.log_artifact(mlflow_id, str(path), "trace")
        if b["name"] == "harness_samples" and path.is_file() and appends:  # lm-eval's samples: an evaluation table
            from marin.tracking.tables import log_samples

            log_samples(self.client, mlflow_id, path, b["digest"])
        if b["name"] in ("model", "hf_model"):
            self.models.log_output(mlflow_id, log, r)
        if log.stage == "report" and b["name"] == "report" and path.is_dir():
            self.client.log_artifacts(mlflow_id, str(path), "report")  # the report itself, beside its ledger
        if log.stage == "report" and b["name"] == "report_json" and path.is_file():
            self.models.register(log, readers.read_json(path, "report"))


def _experiment_tags(started: dict[str, Any]) -> dict[str, str]:
    """The DVC experiment a run belongs to, as a tag DVC's users search by (``tags.dvc_experiment = 'naggy-toea'``)."""
    exp = experiment(started)
    return {"dvc_experiment": exp, "marin.dvc_experiment": exp} if exp else {}


def _made(run: Any) -> tuple[int, str]:
    """The order in which MLflow runs were made (by marin's creation tag): the first one stays."""
    return int(run.data.tags.get(CREATED, "0")), run.info.run_id


def _racing(write: Any, tries: int = 4) -> None:
    """A write that another stage syncing at the same moment can collide with: MLflow makes an
    experiment's datasets and a run's params by check-then-insert, so one of two concurrent inserts
    fails on the unique key; written again, it finds the other's row (the same value)."""
    for i in range(tries):
        try:
            write()
            return
        except Exception as e:
            text = str(e)
            if i == tries - 1 or not any(k in text for k in ("UniqueViolation", "UNIQUE constraint", "IntegrityError",
                                                              "duplicate key")):
                raise
            time.sleep(0.2 * (i + 1))


def sync(root: Path, uri: str | None = None, full: bool = True, index: Index | None = None) -> SyncReport:
    """Create or complete one MLflow run per ledger run; unchanged runs are not touched.

    ``full``: look at every ledger run and every MLflow run (``marin mlflow sync``; it repairs a
    mirror that lost runs). Otherwise (after a stage) only the runs that the index says changed
    since this mirror last saw them: the run just written, and any an outage left behind.
    ``index``: the command's ledger index, brought up to date here (else one is opened)."""
    uri = uri or default_uri(root)
    with Index.using(root, index) as idx:
        try:
            return _sync(root, uri, idx, full)
        except MarinError:
            raise
        except Exception as e:  # MLflow raises many kinds (connection, REST, SQL)
            raise TrackingError(f"MLflow at {uri} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}; "
                                "the ledger has everything: run `marin mlflow sync` when it is back") from e


def quiet_mlflow() -> None:
    """MLflow and its SQL migrations log INFO lines on every new store; a stage's output is its own."""
    import logging

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the pyfunc model's copies
    import mlflow  # noqa: F401  (it sets its loggers' levels when imported: set ours after)

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _sync(root: Path, uri: str, idx: Index, full: bool) -> SyncReport:
    quiet_mlflow()
    syncer, report = _Syncer(root, uri), SyncReport(uri)
    report.experiment = syncer.exp
    if full:
        syncer.list_all()
    for run_id in ([r.run_id for r in idx.runs()] if full else mirror.unsynced(idx, uri)):
        log = load_run(root, run_id, validate=False)
        if log.started is not None and not log.problems and log.truncated is None:
            syncer.sync_run(log, report)
            mirror.mark_synced(idx, uri, run_id, log.records[-1].seq, log.records[-1].digest)
    if full:  # exports logged as files only while the hf group was absent, now that it is not
        report.upgraded = syncer.models.upgrade()
    return report


def sync_quietly(root: Path, index: Index | None = None) -> None:
    """After a stage: sync, but never fail the stage; say in one line if MLflow is down."""
    if os.environ.get("MARIN_MLFLOW", "on").lower() in ("0", "off", "false", "no"):
        return
    import sys

    from marin.net import mlflow_env

    mlflow_env()
    try:
        sync(root, full=False, index=index)
    except Exception as e:
        print(f"marin: warning: stage succeeded, MLflow not updated: {str(e).splitlines()[0]}", file=sys.stderr)
