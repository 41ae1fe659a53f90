"""The report's Experiments section: every sweep in the ledger (``marin sweep``), every trial of
each, failed ones included, with what it changed from the baseline, its final train and
validation metrics, its status and its runs; the selected trial and the rule that chose it; and
one figure (validation loss against the swept param). The report tells what was tried, not only
what worked. Every value is a fact citing the sweep's ``trial`` or ``selection`` record."""

from __future__ import annotations

from typing import Any

from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.facts import Context, Facts, esc
from marin.report.figures import sweep_svg
from marin.report.page import Page, V

FIGURE = "sweep"
RUNS_LINK = "../../ledger/runs/{}.jsonl"  # from reports/<model_name>/ to the run file in the project
METRICS = (("loss", "train loss"), ("val_loss", "validation loss"), ("bits_per_byte", "bits per byte"))


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """The sweeps, oldest first, as fact ids; a trial is ``released`` when it ran the report's train run."""
    released = next((r["run_id"] for r in c.doc["lineage"] if r["stage"] == "train"), None)
    return {"sweeps": [_sweep(f, c.ledger.runs[row.run_id], released)
                       for row in c.ledger.index.runs(stage="sweep")]}


def _sweep(f: Facts, log: RunLog, released_train: str | None) -> dict[str, Any]:
    start, trials = log.start, log.of_kind("trial")
    params = log.params
    out: dict[str, Any] = {"run_id": log.run_id, "status": log.status, "method": params["sweep"]["method"],
                           "trials": [], "selection": None,
                           "baseline": {k: f.cite(f"sweep {log.run_id} baseline {k}", log, start,
                                                  f"/body/params/baseline/{esc(k)}").id
                                        for k in params.get("baseline", {})}}
    out["trials"] = [_trial(f, log, rec, released_train) for rec in trials]
    for rec in log.of_kind("selection"):
        sel = rec.body_as("selection")
        out["selection"] = {"trial": sel["trial"], "reason": sel["reason"],
                            "value": f.cite(f"sweep {log.run_id} selected value", log, rec, "/body/value").id
                            if "value" in sel else None}
    out["param"] = next(iter(trials[0].body_as("trial")["params"]), None) if trials else None
    return out


def _trial(f: Facts, log: RunLog, rec: Record, released_train: str | None) -> dict[str, Any]:
    b = rec.body_as("trial")
    name = f"sweep {log.run_id} trial {b['index']}"
    run_ids = [x["run_id"] for x in b["runs"]]
    return {"index": b["index"], "status": f.cite(f"{name} status", log, rec, "/body/status").id,
            "params": {k: f.cite(f"{name} {k}", log, rec, f"/body/params/{esc(k)}").id for k in b["params"]},
            "metrics": {k: f.cite(f"{name} {label}", log, rec, f"/body/metrics/{k}").id
                        for k, label in (("step", "last step"), *METRICS) if k in b["metrics"]},
            "runs": run_ids, "released": released_train in run_ids,
            "plot": {"x": next(iter(b["params"].values()), None), "y": b["metrics"].get("val_loss"),
                     "failed": b["status"] != "succeeded"}}


def lines(p: Page) -> list[str]:
    """The section's Markdown."""
    v, doc = p.v, p.doc
    sweeps = _sweeps(doc)
    out = ["## Experiments", ""]
    if not sweeps:
        return [*out, "No sweep is recorded in the ledger (`marin sweep` records one, with every trial).", ""]
    out += [f"{len(sweeps)} sweep(s) recorded in the ledger, with every trial, failed ones included. Each trial "
            "is a DVC experiment whose stage runs are linked; the metrics are the last values its runs recorded.", ""]
    for s in sweeps:
        out += [f"### Sweep `{s['run_id']}` ({s['method']}, {len(s['trials'])} trial(s), run {s['status']})", ""]
        if s["baseline"]:
            out += ["Baseline: " + ", ".join(f"`{k}` = {v(fid)}" for k, fid in s["baseline"].items()) + ".", ""]
        out += _table(v, s)
        sel = s["selection"]
        if sel is None:
            out += ["No selection is recorded (the sweep did not finish).", ""]
        elif sel["trial"] is None:
            out += [f"No trial was selected: {sel['reason']}.", ""]
        else:
            out += [f"Selected: trial {sel['trial']}, by the rule {sel['reason']} ({v(sel['value'])}).", ""]
        if s is _plotted(sweeps):
            out += [f"![Validation loss against {s['param']}](figures/{FIGURE}.svg)", "",
                    f"*Validation loss (last recorded) of each trial of sweep `{s['run_id']}` against `{s['param']}`; "
                    "a cross marks a failed trial's last value.*", ""]
    return out


def _table(v: V, s: dict[str, Any]) -> list[str]:
    head = ["trial", "status", "changed from baseline", "last step", *(label for _, label in METRICS), "runs"]
    rows: list[list[str]] = []
    for t in s["trials"]:
        note = " (selected)" if s["selection"] and s["selection"]["trial"] == t["index"] else ""
        note += " (released model)" if t["released"] else ""
        runs = ", ".join(f"[`{r}`]({RUNS_LINK.format(r)})" for r in t["runs"]) or "none"
        rows.append([f"{t['index']}{note}", v(t["status"]),
                     ", ".join(f"`{k}` = {v(fid)}" for k, fid in t["params"].items()) or "nothing",
                     v(t["metrics"].get("step")), *(v(t["metrics"].get(k)) for k, _ in METRICS), runs])
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows), ""]


def _plotted(sweeps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep the figure shows: the latest whose first swept param is a number in some trial with a value."""
    for s in reversed(sweeps):
        pts = [t["plot"] for t in s["trials"]]
        if any(isinstance(p["x"], int | float) and not isinstance(p["x"], bool) and p["y"] is not None for p in pts):
            return s
    return None


def figures(doc: dict[str, Any]) -> dict[str, str]:
    """``{"sweep": svg}`` for the plotted sweep, else nothing; deterministic like the training curves."""
    s = _plotted(_sweeps(doc))
    return {} if s is None else {FIGURE: sweep_svg(s)}


def _sweeps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    section: dict[str, Any] = doc.get("experiments") or {}
    return section.get("sweeps") or []
