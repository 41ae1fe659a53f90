"""Reference models beside ours, in the Benchmarks section of the report and of its card: each model
that params.yaml's ``evaluate.references`` lists, from the latest succeeded run of its stage
``reference_<name>`` (:mod:`marin.evaluate.reference_stage`): its licence, the parameters and training
tokens its card states, its bits per byte on the validation text (its own tokenizer) and its result on
each harness task our model ran, every number a fact cited from that run's records.

They are not in the card's ``model-index``: the Hub reads every entry there as a result of the model
the card describes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marin.evaluate.reference_agreement import FRAMEWORKS
from marin.evaluate.reference_agreement import PREFIX as AGREEMENT
from marin.ledger.store import RunLog
from marin.report import harness_section
from marin.report.facts import Context, Facts
from marin.report.page import Page, V

STAGE = "reference_"


def facts(f: Facts, c: Context) -> list[dict[str, Any]]:
    """One entry per listed reference with a succeeded run, in params.yaml's order."""
    from marin import config

    ledger, path = c.ledger, Path(c.root) / "params.yaml"
    refs = config.load(path).evaluate.references if path.is_file() else ()
    out: list[dict[str, Any]] = []
    for ref in refs:
        done = [r for r in ledger.index.runs(f"{STAGE}{ref.name}") if r.status == "succeeded"]
        if done:
            out.append(_one(f, ledger.runs[done[-1].run_id]))
    return out


def _one(f: Facts, log: RunLog) -> dict[str, Any]:
    s = log.start
    name = log.params["reference"]["name"]
    row: dict[str, Any] = {"run_id": log.run_id, "name": name,
                           "license": f.cite(f"{name} licence", log, s, "/body/params/reference/license").id,
                           "results": {}}
    if log.determinism_class.get("torch"):  # the library its numbers came from: the package list
        row["torch"] = f.cite(f"{name} torch", log, s, "/body/determinism_class/torch").id
    for r in log.of_kind("eval"):
        b = r.body_as("eval")
        if b["name"] == "card":
            ledger = b["values"].get("stated_by") == "ledger"  # this project's own export: its train run says
            said = f"its train run {b['values'].get('training_run')}" if ledger else "its card"
            for k in ("parameters", "training_tokens"):
                row[k] = f.cite(f"{name} {k} ({said})", log, r, f"/body/values/{k}").id
            if ledger:
                row["own_export"] = f.cite(f"{name}: this project's export run", log, r, "/body/values/export_run").id
        elif b["name"].startswith(AGREEMENT):  # this project's export of the weights evaluate scored
            task = b["name"].removeprefix(AGREEMENT)
            row.setdefault("agreement", {})[task] = {
                k: f.cite(f"{name} against evaluate, {task}: {k.replace('_', ' ')}", log, r, f"/body/values/{k}").id
                for k, x in b["values"].items() if k != "largest_loglikelihood_difference" and x != ""}
            row["agreement"][task]["largest"] = f.cite(
                f"{name} against evaluate, {task}: largest log-likelihood difference (nats)", log, r,
                "/body/values/largest_loglikelihood_difference/value").id
        elif b["name"] == "cost":
            row["cost"] = {k: f.cite(f"{name} cost: {k.replace('_', ' ')}", log, r, f"/body/values/{k}").id
                           for k in b["values"]}
        elif b["name"] == "model" and "corpus" not in b:
            row["bits_per_byte"] = f.cite(f"{name} validation bits per byte", log, r,
                                          "/body/values/bits_per_byte/value").id
        elif harness_section.is_harness(b) and "error" not in b["values"]:
            task = b["name"].removeprefix(harness_section.PREFIX)
            for m in harness_section.metrics(b["values"]):
                row["results"][f"{task} {m}"] = {
                    k: f.cite(f"{name} {task} {m}{' stderr' if k else ''}", log, r, f"/body/values/{m}{k}/value").id
                    for k in ("", "_stderr") if f"{m}{k}" in b["values"]}
    if "cost" in row:  # the time it took: its run.finished (a replay takes other seconds: not a value it records)
        row["wall_s"] = f.cite(f"{name} wall time (s)", log, log.end, "/body/wall_s").id
    return row


def lines(p: Page) -> list[str]:
    """The report's table of reference models (:func:`compared`)."""
    return compared(p.v, p.doc)


def compared(v: V, doc: dict[str, Any]) -> list[str]:
    """The table (Markdown lines): our model, then each reference, one column per harness result."""
    refs: list[dict[str, Any]] = doc.get("reference_models") or []
    hz: dict[str, Any] = doc.get("harness") or {}
    if not refs:
        return []
    rows: list[dict[str, Any]] = hz.get("rows", [])
    evaluation: dict[str, Any] = doc.get("evaluation") or {}
    evaluated: list[dict[str, Any]] = evaluation.get("rows", [])
    cols = [f"{r['task']} {r['metric']}" for r in rows]
    ours = {f"{r['task']} {r['metric']}": {"": r["value"], "_stderr": r.get("stderr")} for r in rows}
    bpb = next((r["bits_per_byte"] for r in evaluated if r["name"] == "model" and r["corpus"] == "all"), None)
    out = ["### Reference models on the same requests", "",
           "Other models on exactly the requests above (the same tasks, items, shots and seeds), each scored by "
           "lm-evaluation-harness's own `hf` model (transformers on CPU, float32) in a run of its own stage "
           "(`reference_<name>`, its folder pinned by digest), and its bits per byte on the validation text with its "
           "own tokenizer. Parameters and training tokens are those its card states, or, for a folder that is this "
           "project's own export byte for byte, those its ledger states (its train run's parameter count and "
           "steps × batch size × sequence length).", "",
           "| model | run | licence | parameters | training tokens | validation bits/byte | "
           + " | ".join(f"`{c.split()[0]}` {c.split()[1]}" for c in cols) + " |", "|" + "---|" * (6 + len(cols)),
           _row(v, ["this model", f"`{hz.get('run_id', '')}`", "(above)", v(doc["model"]["n_params"]),
                    v(doc["training"]["tokens_seen"]), v(bpb) if bpb else "–"], cols, ours)]
    for ref in refs:
        out.append(_row(v, [ref["name"], f"`{ref['run_id']}`", v(ref["license"]), v(ref.get("parameters")),
                            v(ref.get("training_tokens")), v(ref["bits_per_byte"]) if ref.get("bits_per_byte")
                            else "–"], cols, ref["results"]))
    notes = [*(_cost(v, ref) for ref in refs if ref.get("cost")), *(x for ref in refs for x in _agreement(v, ref))]
    return [*out, "", *notes, ""] if notes else [*out, ""]


def _agreement(v: V, ref: dict[str, Any]) -> list[str]:
    """Where this project's export, as a reference, scores items otherwise than evaluate did, and why."""
    tasks: dict[str, dict[str, str]] = ref.get("agreement") or {}
    if not tasks:
        return []
    run = next(iter(tasks.values()))["evaluate_run"]
    parts = [f"`{t}`: {v(a['differing'])} of {v(a['items'])} items" + (f" ({v(a['differing_items'])})"
             if a.get("differing_items") else "") + f", largest log-likelihood difference {v(a['largest'])} nats"
             for t, a in sorted(tasks.items())]
    return [f"- `{ref['name']}` holds the weights of evaluate run {v(run)}, run by another framework; items "
            f"scored differently: {'; '.join(parts)}. Why: {FRAMEWORKS}."]


def _cost(v: V, ref: dict[str, Any]) -> str:
    """What scoring a reference cost: its run's wall time, the items and the forward passes of each part."""
    c = ref["cost"]
    return (f"- `{ref['name']}` took {v(ref['wall_s'])} s wall (its run, model loading included): "
            f"{v(c['harness_samples'])} harness samples ({v(c['harness_requests'])} requests) in "
            f"{v(c['harness_forward_passes'])} forward passes, and {v(c['validation_docs'])} validation documents "
            f"({v(c['validation_windows'])} windows of its context) in {v(c['validation_forward_passes'])}, "
            f"batch size {v(c['batch_size'])} (lm-eval's batching).")


def _row(v: V, head: list[str], cols: list[str], results: dict[str, dict[str, str | None]]) -> str:
    cells: list[str] = []
    for c in cols:
        got = results.get(c) or {}
        cells.append((v(got[""]) if got.get("") else "–") + (f" ± {v(got['_stderr'])}" if got.get("_stderr") else ""))
    return "| " + " | ".join([*head, *cells]) + " |"
