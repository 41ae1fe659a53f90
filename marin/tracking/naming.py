"""How marin's ledger runs read in MLflow: run and pipeline names, the short tags of the run list,
the descriptions MLflow's pages show, and the conversions of ledger values to MLflow's (times in
ms, params as dotted strings, dataset digests). Pure functions of ledger records; the writes are
:mod:`marin.tracking.sync`'s."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from typing import Any

from marin.config import flatten
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.stages import NAMES

# Descriptions shown on MLflow's pages (the UI cuts long tag keys; these say what each one holds).
EXPERIMENT_NOTE = """The MLflow view of a marin ledger: one run per ledger run (stage run), nested under one
run per pipeline (git commit). The ledger (`ledger/runs/*.jsonl`, checked by `marin ledger check`) is
the source of truth; `marin mlflow sync` rebuilds this view from it."""
PIPELINE_NOTE = "All stage runs recorded at one git commit (`marin.pipeline`), each a child run."
RUN_STAGES = (*NAMES, "sweep", "publish")  # dvc.yaml's stages, then `marin sweep` and `marin publish` runs
RUN_NOTE = f"""One marin ledger run (`ledger/<run id>.jsonl` under Artifacts). Tags:

| tag | holds |
|---|---|
| `marin.run_id` | the ledger run id |
| `marin.stage` | {", ".join(RUN_STAGES)} |
| `marin.recipe_digest` | digest of stage, command, params, code, inputs, determinism class |
| `marin.determinism_digest` | digest of the determinism class (`determinism.*` params) |
| `marin.code_digest` | digest of the pipeline's code |
| `marin.output.<name>` | sha256 of each output: an input's digest leads to its producer |
| `marin.status` | succeeded, failed or unfinished, as the ledger says |
| `marin.synced_seq`, `marin.synced_digest` | the last ledger record this MLflow run reflects |
| `marin.verification.*` | the latest `marin verify` of the run: result, mode, record |
| `stage`, `status`, `recipe`, `commit` | short copies for the run list (recipe: 12 hex, commit: 8) |
"""


def ms(time: str) -> int:
    return int(dt.datetime.fromisoformat(time.replace("Z", "+00:00")).timestamp() * 1000)


def flat(prefix: str, obj: Any) -> dict[str, str]:
    """Dotted keys with string values, as MLflow params are."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(obj, prefix).items()}


def short_digest(digest: str) -> str:
    """MLflow caps dataset digests at 36 characters: the first 32 hex of the sha256."""
    return digest.split(":", 1)[1][:32]


def run_name(stage: str, run_id: str) -> str:
    """A stage run's name in MLflow's run list, short enough not to be cut: the stage and the run id's
    random tail (``train 1a2b3c4d``), distinct as run ids are (``<stage>-<time>-<8 hex>``)."""
    return f"{stage} {run_id.rsplit('-', 1)[-1]}"


def experiment(started: Mapping[str, Any]) -> str | None:
    """The DVC experiment a run belongs to (``dvc exp run``: run.started.execution.dvc_experiment), or None."""
    return ((started.get("execution") or {}).get("dvc_experiment") or {}).get("name")


def pipeline_key(started: Mapping[str, Any]) -> str:
    """The pipeline a stage run belongs to: its git commit (12 hex), the diff's digest if dirty, and the DVC
    experiment's name under ``dvc exp run`` (its runs share the baseline's commit, params.yaml aside)."""
    code = started["code"]
    key = (code["git_commit"] or "no-commit")[:12]
    if code["dirty"]:
        key += "-dirty-" + code["diff_digest"].split(":")[1][:8]
    exp = experiment(started)
    return key + (f"-exp-{exp}" if exp else "")


def pipeline_name(started: Mapping[str, Any]) -> str:
    """A pipeline run's name: the DVC experiment's (``naggy-toea``, as ``dvc exp show`` lists it), else
    ``pipeline 1a2b3c4d`` (commit), ``+5e6f7a`` for a dirty tree's diff."""
    code = started["code"]
    if exp := experiment(started):
        return exp
    name = "pipeline " + (code["git_commit"] or "no-commit")[:8]
    return name + ("+" + code["diff_digest"].split(":")[1][:6] if code["dirty"] else "")


HEADLINE_STAGES = ("evaluate", "evaluate_instruct")  # the model's own scores (a reference stage scores another)


def headline_metrics(stage: str, r: Record) -> dict[str, float]:
    """The headline scores of an eval record, as its pipeline run carries them to sort by (the DVC metrics
    files' selection, :mod:`marin.evaluate.metrics_file`): validation bits per byte, each harness task's
    headline, each instruction-tuned model's token and choice accuracy."""
    from marin.headline import INSTRUCTION_SCORES, task_headline

    b = r.body
    if stage not in HEADLINE_STAGES or r.kind != "eval":
        return {}
    values = {k: v["value"] for k, v in b["values"].items() if isinstance(v, dict)}
    if b["name"] == "model" and b["split"] == "validation" and "corpus" not in b:
        keep = {"bits_per_byte"}
    elif b["name"].startswith("harness:"):
        keep = {task_headline(values)}
    elif b["name"].endswith("_instructions") and not b["name"].startswith("constant_"):
        keep = set(INSTRUCTION_SCORES)
    else:
        return {}
    return {f"{eval_prefix(r)}/{k}": v for k, v in values.items() if k in keep and isinstance(v, float)}


def short_tags(log: RunLog) -> dict[str, str]:
    """Tags with short keys, so that the run list's tag column reads without hovering."""
    s = log.start.body
    return {"stage": s["stage"], "recipe": s["recipe_digest"].split(":")[-1][:12],
            "commit": (s["code"]["git_commit"] or "none")[:8]}


def run_note(log: RunLog) -> str:
    """A stage run's description: its key facts on the first line (the run list shows it), then what
    each tag holds."""
    s = log.start.body
    return (f"{s['stage']} run `{log.run_id}`: recipe {s['recipe_digest'][:19]}…, commit "
            f"{(s['code']['git_commit'] or 'none')[:12]}, determinism {s['determinism_digest'][:19]}…\n\n" + RUN_NOTE)


# A task's own levels (chance, a constant answer's score): the same for every model, so params, not metrics.
CONSTANTS = ("chance/", "constant/")


def eval_prefix(r: Record) -> str:
    """An eval record's MLflow name, as MLflow users name evaluation results: ``eval/<task>`` for a
    harness task (``eval/<task>/<scorer>`` for another scorer's: ``unigram``, ``decontamination``),
    ``eval/<split>[/<corpus>]`` for the model's own evaluation (``…/<name>`` for another's)."""
    b = r.body
    scorer, _, task = b["name"].partition(":")
    if task:
        parts = [task] + ([] if scorer == "harness" else [scorer])
    else:
        parts = [b["split"], *([b["corpus"]] if "corpus" in b else []), *([] if b["name"] == "model" else [b["name"]])]
    return "eval/" + "/".join(parts)


def eval_metrics(r: Record) -> dict[str, float]:
    """An eval record's measurements of the model (``eval/<task>/acc``), its constants left out."""
    return {f"{eval_prefix(r)}/{k}": v["value"] for k, v in r.body_as("eval")["values"].items()
            if isinstance(v, dict) and not k.startswith(CONSTANTS)}


def eval_params(r: Record) -> list[Any]:
    """An eval record's other values as params: counts (tokens, samples), settings (num_fewshot, the
    harness version) and the task's constants (chance)."""
    from mlflow.entities import Param

    out = []
    for k, v in r.body_as("eval")["values"].items():
        if isinstance(v, dict) and not k.startswith(CONSTANTS):
            continue  # a measurement: a metric
        value = v["value"] if isinstance(v, dict) else v
        text = value if isinstance(value, str) else json.dumps(value)
        out.append(Param(f"{eval_prefix(r)}/{k}"[:250], text[:6000]))
    return out


def user() -> str:
    """Who made the MLflow run (its "Created by"): the user syncing the ledger."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        return f"uid {os.getuid()}"
