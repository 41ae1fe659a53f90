"""The report's Data section: the fetched sources (fetch's ``input`` records), the curation funnel
(curate's ``curate_manifest`` output) and the composition of each split with the tokenizer
(tokenize's ``tokenize_manifest``), every number a fact cited from the record or the recorded file."""

from __future__ import annotations

from typing import Any, cast

from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.facts import Context, Facts, esc, md_escape, output, read_output_file
from marin.report.page import Page, table


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """Fact ids of the sources, the funnel, the splits and the tokenizer; the curate run's parameters
    (the datasheet's filters) as recorded."""
    curate, tokenize = c.logs["curate"], c.logs["tokenize"]
    sources = _sources(f, c.logs["fetch"])
    cm_rec = output(curate, "curate_manifest")
    funnel = _funnel(f, curate, cm_rec, read_output_file(c.root, cm_rec))
    tm_rec = output(tokenize, "tokenize_manifest")
    tm = read_output_file(c.root, tm_rec)
    cite = _citer(f, tokenize, tm_rec, tm)
    out = {"sources": sources, "funnel": funnel,
           "splits": {split: _split(cite, split, tm["splits"][split]) for split in sorted(tm["splits"])},
           "tokenizer": {"vocab_size": cite("tokenizer vocabulary size", "/tokenizer/vocab_size"),
                         "type": cite("tokenizer type", "/tokenizer/type"),
                         "digest": cite("tokenizer digest", "/tokenizer/digest")}}
    return {**out, **_curate_params(curate)}


def _sources(f: Facts, fetch: RunLog) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in fetch.of_kind("input"):
        name = r.body_as("input")["name"]
        out.append({"name": name, "locator": f.cite(f"{name} locator", fetch, r, "/body/locator").id,
                    "license": f.cite(f"{name} license", fetch, r, "/body/license").id,
                    **({"text_license": f.cite(f"{name} texts' own licence", fetch, r, "/body/text_license").id}
                       if "text_license" in r.body else {}),
                    "digest": f.cite(f"{name} archive digest", fetch, r, "/body/digest").id,
                    "bytes": f.cite(f"{name} archive bytes", fetch, r, "/body/size").id})
    return out


def _citer(f: Facts, log: RunLog, rec: Record, doc: dict[str, Any]) -> Any:
    """``cite(label, pointer)``: the fact id of a value inside the recorded file ``doc``."""
    def cite(label: str, pointer: str) -> str:
        return f.cite_file(label, log, rec, doc, pointer).id
    return cite


def _funnel(f: Facts, curate: RunLog, rec: Record, cm: dict[str, Any]) -> list[dict[str, Any]]:
    cite = _citer(f, curate, rec, cm)
    funnel: list[dict[str, Any]] = []
    for corpus in sorted(cm["funnel"]["corpora"]):
        c = cm["funnel"]["corpora"][corpus]
        base = f"/funnel/corpora/{esc(corpus)}"
        removed = {step: {"docs": cite(f"{corpus}: docs removed by {step}", f"{base}/removed/{esc(step)}/docs"),
                          "bytes": cite(f"{corpus}: bytes removed by {step}", f"{base}/removed/{esc(step)}/bytes")}
                   for step in sorted(c["removed"]) if c["removed"][step]["docs"]}
        funnel.append({"corpus": corpus, "license": cite(f"{corpus} license", f"{base}/license"),
                       "in_docs": cite(f"{corpus}: documents in", f"{base}/in/docs"),
                       "in_bytes": cite(f"{corpus}: bytes in", f"{base}/in/bytes"),
                       "kept_docs": cite(f"{corpus}: documents kept", f"{base}/kept/docs"),
                       "kept_bytes": cite(f"{corpus}: bytes kept", f"{base}/kept/bytes"),
                       "kept_raw_bytes": cite(f"{corpus}: bytes kept, as read", f"{base}/kept_raw/bytes")
                       if "kept_raw" in c else None,
                       "removed": removed})
    return funnel


def _split(cite: Any, split: str, sp: dict[str, Any]) -> dict[str, Any]:
    base = f"/splits/{esc(split)}"
    return {"docs": cite(f"{split}: documents", f"{base}/docs"), "tokens": cite(f"{split}: tokens", f"{base}/tokens"),
            "bytes": cite(f"{split}: bytes", f"{base}/bytes"),
            "corpora": {c: {k: cite(f"{split} {c}: {k}", f"{base}/corpora/{esc(c)}/{k}")
                            for k in ("docs", "tokens", "bytes")} for c in sorted(sp["corpora"])}}


def _curate_params(curate: RunLog) -> dict[str, Any]:
    """The curate run's parameters as recorded: its filters, the licence notes, the Hub datasets and
    what each source's extraction took (not facts: the datasheet prints them as the run recorded them)."""
    params = curate.params
    sources: list[dict[str, Any]] = params.get("fetch", {}).get("sources", [])
    return {"curate_params": params.get("curate", {}),
            "license_notes": {src["name"]: src["license_note"] for src in sources if src.get("license_note")},
            "hub_datasets": [src["hub_dataset"]  # the cards' datasets: Hub ids only, none made up
                             for src in sources if src.get("hub_dataset")],
            "extract": {src["name"]: [{k: e.get(k, []) for k in ("corpus", "include", "exclude")}
                                      for e in src.get("extract", [])]
                        for src in sources},
            "filters_source": {"run_id": curate.run_id, "seq": 0, "record": curate.start.digest}}


def lines(p: Page) -> list[str]:
    data, v = p.doc["data"], p.v
    out = ["## Data", "", "### Sources", ""]
    out += table(["source", "locator", "license (the archive's)", "texts' own licence", "archive digest", "bytes"],
                 [[s["name"], v(s["locator"]), v(s["license"]), v(s["text_license"]) if s.get("text_license")
                   else "the same", v(s["digest"]), v(s["bytes"])] for s in data["sources"]])
    notes: dict[str, str] = data.get("license_notes") or {}
    if notes:  # the attribution a licence asks for (CC BY), as params.yaml's license_note states it
        out += ["Licence notes and attribution (`fetch.sources[].license_note` in the curate run's parameters):", "",
                *(f"- `{name}`: {md_escape(note)}" for name, note in notes.items()), ""]
    out += ["### Curation funnel", "", "Documents and bytes removed by each step (steps that removed nothing "
            "are left out). Bytes are as read from the archive up to the kept documents; what is stored is their "
            "text with the leading and trailing whitespace stripped and Unicode-normalized (the last row).", ""]
    out += table(["corpus", "step", "documents", "bytes"], _funnel_rows(p))
    out += ["### Composition", ""]
    out += table(["split", "corpus", "license", "documents", "tokens", "bytes"],
                 [[split, c, v(_license(data, c)), v(x["docs"]), v(x["tokens"]), v(x["bytes"])]
                  for split, sp in data["splits"].items() for c, x in sp["corpora"].items()]
                 + [[split, "all", "", v(sp["docs"]), v(sp["tokens"]), v(sp["bytes"])]
                    for split, sp in data["splits"].items()])
    tok = data["tokenizer"]
    return [*out, f"Tokenizer: {v(tok['type'])}, vocabulary {v(tok['vocab_size'])}, digest {v(tok['digest'])}.", ""]


def _funnel_rows(p: Page) -> list[list[str]]:
    v, rows = p.v, cast(list[list[str]], [])
    for c in p.doc["data"]["funnel"]:
        rows.append([c["corpus"], "in", v(c["in_docs"]), v(c["in_bytes"])])
        rows += [[c["corpus"], f"removed by {step}", v(r["docs"]), v(r["bytes"])] for step, r in c["removed"].items()]
        if c.get("kept_raw_bytes"):
            rows.append([c["corpus"], "kept, as read", v(c["kept_docs"]), v(c["kept_raw_bytes"])])
        rows.append([c["corpus"], "kept, stored (stripped, normalized)", v(c["kept_docs"]), v(c["kept_bytes"])])
    return rows


def _license(data: dict[str, Any], corpus: str) -> str | None:
    return next((c["license"] for c in data["funnel"] if c["corpus"] == corpus), None)
