"""The report's Memorisation section: the greedy samples and the instruct answers it shows, traced to the
training data (stage trace_index's suffix array, ``marin trace``), as the evaluate and evaluate_instruct
runs recorded the traces (``evals/trace/*.json``): per output its longest verbatim span, the documents
holding it and their licences, and the tokens inside spans of at least ``trace.min_tokens``; the share of
all shown output tokens inside such spans is a derived fact. Every value is cited from the recorded trace
file, so ``marin report verify`` re-reads it. The trace counts only when the index is of this model's
training data: the index run's ``tokens`` input must be the train run's."""

from __future__ import annotations

from typing import Any

from marin.ledger.query import Ledger
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.facts import Context, Facts, read_output_file
from marin.report.page import Page

SHARE = "Σ tokens inside spans / Σ output tokens"  # a formula of marin.report.facts.FORMULAS
DOCUMENTS = 1  # documents named per longest span (its count covers them all): the report stays a page to read
SHOWN = 5  # instruct answers traced: those the Base and instruct section shows (marin.report.instruct.SAMPLES)


def _inputs(log: RunLog) -> dict[str, str]:
    return {i["name"]: i["digest"] for i in log.bodies("input")}


def _trace_file(log: RunLog) -> Record | None:
    return next((r for r in log.of_kind("output") if r.body_as("output")["name"] == "trace_samples"), None)


def _indexes_training(ledger: Ledger, log: RunLog, train_tokens: str) -> bool:
    index = _inputs(log).get("trace_index")
    producers = ledger.producers_of(index) if index else []
    return bool(producers) and _inputs(producers[-1][0]).get("tokens") == train_tokens


def _rows(f: Facts, log: RunLog, rec: Record, data: dict[str, Any], name: str,
          limit: int | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, t in enumerate(data["sets"].get(name, [])[:limit]):
        at = f"/sets/{name}/{i}"
        row: dict[str, Any] = {k: f.cite_file(f"{name} {k}", log, rec, data, f"{at}/{k}").id
                               for k in ("prompt", "tokens", "covered", "longest")}
        if t["longest_at"] is not None:
            span = f"{at}/spans/{t['longest_at']}"
            row["count"] = f.cite_file(f"{name} longest span's occurrences", log, rec, data, f"{span}/count").id
            row["documents"] = [(f.cite_file("document", log, rec, data, f"{span}/documents/{j}/id").id,
                                 f.cite_file("its licence", log, rec, data, f"{span}/documents/{j}/license").id)
                                for j in range(min(DOCUMENTS, len(t["spans"][t["longest_at"]]["documents"])))]
        rows.append(row)
    return rows


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """The section's facts (ids), or None when no run traced this model's outputs."""
    ledger, doc = c.ledger, c.doc
    train = ledger.runs[next(r["run_id"] for r in doc["lineage"] if r["stage"] == "train")]
    shown: list[dict[str, Any]] = [doc.get("evaluation") or {}, doc.get("instruct") or {}]
    runs: list[str | None] = [s.get("run_id") for s in shown]
    sets: dict[str, int | None] = {"greedy_samples": None, "base_instructions": SHOWN, "instruct_instructions": SHOWN}
    out: dict[str, Any] = {"rows": [], "tokens": [], "covered": []}
    for log in (ledger.runs[r] for r in runs if r):
        rec = _trace_file(log)
        if rec is None or not _indexes_training(ledger, log, _inputs(train)["tokens"]):
            continue
        data = read_output_file(f.root, rec)
        out.setdefault("min_tokens", f.cite_file("shortest span traced", log, rec, data, "/min_tokens").id)
        for name, limit in sets.items():
            rows = _rows(f, log, rec, data, name, limit)
            out["rows"] += [{"set": name, **r} for r in rows]
    if not out["rows"]:
        return None
    covered, tokens = [f.items[r["covered"]] for r in out["rows"]], [f.items[r["tokens"]] for r in out["rows"]]
    out["share"] = f.derive("share of shown output tokens inside verbatim spans", SHARE, [*covered, *tokens]).id
    del out["tokens"], out["covered"]
    return out


KIND = {"greedy_samples": "greedy sample", "base_instructions": "base answer",
        "instruct_instructions": "instruct answer"}


def lines(p: Page) -> list[str]:
    """The section's Markdown lines."""
    v, m = p.v, p.doc.get("memorisation")
    out = ["## Memorisation", ""]
    if m is None:
        return [*out, "Not measured: no evaluate run traced this model's outputs against an index of its training "
                "data (stage trace_index; `marin trace`).", ""]
    out += [f"The greedy samples and instruct answers this report shows, traced to the training data (the curated "
            f"train split and the instruction train set as the tokenizer saw them, indexed by stage trace_index as a "
            f"suffix array) for maximal spans of at least {v(m['min_tokens'])} tokens found there verbatim "
            f"(`marin trace --run RUN` repeats a run's trace): {v(m['share'])} of their output tokens lie inside "
            "such spans. Per output, its longest run of tokens found verbatim (a span when it is that long), and for a "
            "span how often the training data holds it and the first document holding it, with its licence "
            "(`marin trace` lists them all):", "",
            "| output | prompt | tokens | inside spans | longest verbatim run | occurrences | document (licence) |",
            "|---|---|---|---|---|---|---|"]
    for r in m["rows"]:
        docs = ", ".join(f"{v(d)} ({v(lic)})" for d, lic in r.get("documents", [])) or "none"
        out.append(f"| {KIND[r['set']]} | {v(r['prompt'])} | {v(r['tokens'])} | {v(r['covered'])} | "
                   f"{v(r['longest'])} | {v(r['count']) if 'count' in r else 'none'} | {docs} |")
    return [*out, ""]
