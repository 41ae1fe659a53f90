"""The lm-evaluation-harness results where people look: the report's Evaluation table (task,
metric, chance, unigram baseline where one applies, the model with its stderr), the model card's
``model-index`` (the export's card, ``models/hf/README.md``, lists the same values from metrics/eval.json).

Every number is a fact cited from the evaluate run's ``eval`` records named ``harness:<task>``
(:mod:`marin.evaluate.harness_run`), so ``marin report verify`` re-derives it from the ledger.
"""

from __future__ import annotations

from typing import Any

PREFIX, BASELINE = "harness:", "unigram:"  # the model's records; the unigram baseline's, on the same requests
FACTS = ("samples", "num_fewshot", "fewshot_seed", "harness_version", "task_config_digest", "loglikelihoods_digest")


def is_harness(body: dict[str, Any]) -> bool:
    """An eval record of the model on a harness task."""
    return str(body.get("name", "")).startswith(PREFIX)


def from_harness(body: dict[str, Any]) -> bool:
    """An eval record the harness made: the model's, or the unigram baseline's."""
    return str(body.get("name", "")).startswith((PREFIX, BASELINE))


def metrics(values: dict[str, Any]) -> list[str]:
    """The metric names of a task's recorded values (not stderrs, chance levels or facts), sorted."""
    return sorted(k for k, v in values.items()
                  if isinstance(v, dict) and not k.endswith("_stderr") and not k.startswith("chance/"))


def facts(f: Any, log: Any) -> dict[str, Any]:
    """The harness rows of the evaluate run ``log``, each value cited as a fact of ``f``."""
    rows, failed = [], []
    base = {r.body["name"].removeprefix(BASELINE): r for r in log.of_kind("eval")
            if r.body["name"].startswith(BASELINE) and "error" not in r.body["values"]}
    for r in log.of_kind("eval"):
        if not is_harness(r.body):
            continue
        task, v = r.body["name"].removeprefix(PREFIX), r.body["values"]
        if "error" in v:
            failed.append({"task": task, "error": f.cite(f"{task} error", log, r, "/body/values/error").id})
            continue
        about = {k: f.cite(f"{task} {k}", log, r, f"/body/values/{k}").id for k in FACTS if k in v}
        for m in metrics(v):
            rows.append({"task": task, "metric": m, "value": _cite(f, log, r, m, m),
                         "stderr": _cite(f, log, r, f"{m}_stderr", f"{m} stderr"),
                         "chance": _cite(f, log, r, f"chance/{m}", f"{m} chance"),
                         "unigram": _cite(f, log, base[task], m, f"{m} unigram baseline") if task in base else None,
                         **about})
    return {"run_id": log.run_id, "rows": rows, "failed": failed}


def _cite(f: Any, log: Any, r: Any, key: str, what: str) -> str | None:
    """The fact id of the exact value ``key`` of a harness record, or None where it has none."""
    if key not in r.body["values"]:
        return None
    task = r.body["name"].removeprefix(PREFIX).removeprefix(BASELINE)
    return f.cite(f"{task} {what}", log, r, f"/body/values/{_esc(key)}/value").id


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # RFC 6901


def lines(d: Any, doc: dict[str, Any]) -> list[str]:
    """The report's harness table (Markdown lines), under its Evaluation section."""
    hz = doc.get("harness")
    if not hz or not (hz["rows"] or hz["failed"]):
        return []
    out = ["### Benchmarks (lm-evaluation-harness)", "",
           f"Tasks run by lm-evaluation-harness on the JAX model itself (evaluate run `{hz['run_id']}`), their data "
           "cut from the validation split only. Chance is the task's stated level; the unigram baseline is the same "
           "requests scored by the add-one unigram model of the train tokens (the baseline of the bits per byte "
           "above), which ignores the context.", "",
           "| task | metric | chance | unigram baseline | model | ± stderr | samples | shots |", "|" + "---|" * 8]
    for r in hz["rows"]:
        out.append(f"| `{r['task']}` | {r['metric']} | {d.v(r['chance']) if r['chance'] else '–'} | "
                   f"{d.v(r['unigram']) if r.get('unigram') else 'n/a'} | "
                   f"{d.v(r['value'])} | {d.v(r['stderr']) if r['stderr'] else '–'} | {d.v(r.get('samples'))} | "
                   f"{d.v(r.get('num_fewshot'))} |")
    out.append("")
    for x in hz["failed"]:
        out += [f"`{x['task']}` did not run: {d.v(x['error'])}", ""]
    return out


def _result(task: str, metric: str, value: float, shots: int, run_id: str) -> Any:
    from marin.export.card import harness_result

    return harness_result(task, metric, value, shots, source_url=f"ledger/runs/{run_id}.jsonl")


def eval_results(doc: dict[str, Any], facts_by_id: dict[str, Any]) -> list[Any]:
    """The report's harness rows as huggingface_hub ``EvalResult`` entries (the card's ``model-index``)."""
    hz = doc.get("harness") or {}
    return [_result(r["task"], r["metric"], facts_by_id[r["value"]]["value"], facts_by_id[r["num_fewshot"]]["value"],
                    hz["run_id"]) for r in hz.get("rows", [])]
