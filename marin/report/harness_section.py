"""The lm-evaluation-harness results where people look: the report's and the model card's Benchmarks
table (task, metric, chance, the unigram baseline where one applies, the best constant answer, the
model with its stderr, its mark against the best baseline, the clean items, samples of items and the
limit; rendered by :func:`marin.export.benchmarks.table`, which renders the export's card's table from
metrics/eval.json too), the stderr method of each metric, and the card's ``model-index`` (a registry
task's under its Hub dataset id and the split it scored).

Every number is a fact cited from the evaluate run's ``eval`` records named ``harness:<task>``
(:mod:`marin.evaluate.harness_run`), the mark a fact derived from them by
:func:`marin.evaluate.baselines.mark`, so ``marin report verify`` re-derives both from the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin.evaluate import baselines as bl
from marin.export.benchmarks import table as benchmarks_table
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.facts import Context, Facts, esc
from marin.report.page import Page, V

PREFIX, BASELINE = "harness:", "unigram:"  # the model's records; the unigram baseline's, on the same requests
FACTS = ("samples", "items", "limit", "num_fewshot", "fewshot_seed", "harness_version", "task_config_digest",
         "loglikelihoods_digest", "decontamination", "contaminated", "excluded",  # these three: evaluate.decontam
         "dataset", "dataset_split")  # a registry task's Hub dataset and the split it scored


def is_harness(values: Mapping[str, object]) -> bool:
    """An eval record's body: the model's on a harness task."""
    return str(values.get("name", "")).startswith(PREFIX)


def from_harness(values: Mapping[str, object]) -> bool:
    """An eval record's body the harness made: the model's, or the unigram baseline's."""
    return str(values.get("name", "")).startswith((PREFIX, BASELINE))


def metrics(values: Mapping[str, object]) -> list[str]:
    """The metric names of a task's recorded values (not stderrs, chance levels or facts), sorted."""
    return sorted(k for k, v in values.items() if isinstance(v, dict) and not k.endswith("_stderr") and "/" not in k)


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """The harness rows of the evaluate run, each value cited as a fact of ``f``; None without the run."""
    log = c.logs.get("evaluate")
    return _rows(f, log) if log is not None else None


def _rows(f: Facts, log: RunLog) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    evals = [(r, r.body_as("eval")) for r in log.of_kind("eval")]
    base = {b["name"].removeprefix(BASELINE): r for r, b in evals
            if b["name"].startswith(BASELINE) and "error" not in b["values"]}
    for r, b in evals:
        if not is_harness(b):
            continue
        task, v = b["name"].removeprefix(PREFIX), b["values"]
        if "error" in v:
            failed.append({"task": task, "error": f.cite(f"{task} error", log, r, "/body/values/error").id})
            continue
        about = {k: f.cite(f"{task} {k}", log, r, f"/body/values/{k}").id for k in FACTS if k in v}
        for m in metrics(v):
            row = {"task": task, "metric": m, "value": _cite(f, log, r, m, m),
                   "stderr": _cite(f, log, r, f"{m}_stderr", f"{m} stderr"),
                   "chance": _cite(f, log, r, f"chance/{m}", f"{m} chance"),
                   "unigram": _cite(f, log, base[task], m, f"{m} unigram baseline") if task in base else None,
                   "constant": _cite(f, log, r, f"constant/{m}", f"{m} constant-answer baseline"),
                   "clean": _cite(f, log, r, f"clean/{m}", f"{m} on the clean items"),
                   **{k: f.cite(f"{task} {m} {k}", log, r, f"/body/values/{esc(f'{k}/{m}')}").id
                      for k in ("better", "stderr_method") if f"{k}/{m}" in v}, **about}
            row["mark"] = _mark(f, row)
            rows.append(row)
    return {"run_id": log.run_id, "rows": rows, "failed": failed}


def package(section: dict[str, Any] | None) -> dict[str, str]:
    """lm-eval for the report's package list: the harness version the evaluate run recorded (a fact id),
    or nothing when no harness task ran."""
    row = next((r for r in (section or {}).get("rows", []) if r.get("harness_version")), None)
    return {"lm-eval (evaluate run)": row["harness_version"]} if row else {}


def _mark(f: Facts, row: dict[str, Any]) -> str | None:
    """The derived fact (id) of a row's mark against its best baseline, or None (no stderr or baseline)."""
    base = [row[k] for k in ("chance", "unigram", "constant") if row.get(k)]
    if not (row["stderr"] and row.get("better") and base):
        return None
    inputs = [f.items[x] for x in (row["value"], row["stderr"], row["better"], *base)]
    return f.derive(f"{row['task']} {row['metric']} against the best baseline", bl.MARK, inputs).id


def _cite(f: Facts, log: RunLog, r: Record, key: str, what: str) -> str | None:
    """The fact id of the exact value ``key`` of a harness record, or None where it has none."""
    b = r.body_as("eval")
    if key not in b["values"]:
        return None
    task = b["name"].removeprefix(PREFIX).removeprefix(BASELINE)
    return f.cite(f"{task} {what}", log, r, f"/body/values/{esc(key)}/value").id


def lines(p: Page) -> list[str]:
    """The report's Benchmarks table (:func:`benchmarks`)."""
    return benchmarks(p.v, p.doc)


def benchmarks(v: V, doc: dict[str, Any]) -> list[str]:
    """The harness table (Markdown lines) of the report's Evaluation section and of its card, rendered by
    :func:`marin.export.benchmarks.table` as the export's card is; ``v`` renders a fact id."""
    hz = doc.get("harness")
    if not hz:
        return []
    return benchmarks_table(hz["rows"], v, f"evaluate run `{hz['run_id']}`", hz["failed"])


def _result(row: dict[str, Any], val: Any, run_id: str) -> Any:
    """One row (fact ids; ``val`` gives a fact's value) as a ``model-index`` entry."""
    from marin.export.card import harness_result

    note = bl.note(val(row["stderr"]), val(row.get("samples")), val(row.get("items")), val(row.get("limit")),
                   val(row.get("mark")))
    return harness_result(row["task"], row["metric"], val(row["value"]), val(row.get("num_fewshot")),
                          source_url=f"ledger/runs/{run_id}.jsonl", note=note, dataset=val(row.get("dataset")),
                          split=val(row.get("dataset_split")))


def eval_results(doc: dict[str, Any], facts_by_id: dict[str, Any]) -> list[Any]:
    """The report's harness rows as huggingface_hub ``EvalResult`` entries (the card's ``model-index``),
    each named with its stderr, samples of items (and limit) and its mark."""
    hz: dict[str, Any] = doc.get("harness") or {}
    rows: list[dict[str, Any]] = hz.get("rows", [])

    def val(fid: str | None) -> Any:
        return facts_by_id[fid]["value"] if fid else None

    return [_result(r, val, hz["run_id"]) for r in rows]
