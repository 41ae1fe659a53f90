"""The report's Evaluation section: bits per byte and perplexity of the model and the unigram baseline
on the validation split, and the greedy samples, each cited from the evaluate run's ``eval`` records
(the harness's own records make the Benchmarks table: :mod:`marin.report.harness_section`)."""

from __future__ import annotations

from typing import Any

from marin.report import harness_section
from marin.report.facts import Context, Facts
from marin.report.page import Page, table


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """Fact ids of each scorer's rows and of the samples; None when no evaluate run read the model."""
    log = c.logs.get("evaluate")
    if log is None:
        return None
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for r in log.of_kind("eval"):
        b = r.body_as("eval")
        if harness_section.from_harness(b):  # the harness's own table: marin.report.harness_section
            continue
        if b.get("samples"):
            samples = [{"prompt": f.cite("sample prompt", log, r, f"/body/samples/{i}/prompt").id,
                        "completion": f.cite("sample completion", log, r, f"/body/samples/{i}/completion").id}
                       for i in range(len(b.get("samples", [])))]
            continue
        corpus = b.get("corpus", "all")
        rows.append({"name": b["name"], "split": b["split"], "corpus": corpus,
                     **{k: f.cite(f"{b['name']} {corpus} {k}", log, r, f"/body/values/{k}/value").id
                        for k in ("bits_per_byte", "perplexity")},
                     "tokens": f.cite(f"{b['name']} {corpus} tokens", log, r, "/body/values/tokens").id})
    return {"run_id": log.run_id, "rows": rows, "samples": samples}


def lines(p: Page) -> list[str]:
    ev, v = p.doc["evaluation"], p.v
    out = ["## Evaluation", ""]
    if ev is None:
        return [*out, "not recorded: no evaluate run read this model", ""]
    out += [f"Validation split, evaluate run `{ev['run_id']}`. Bits per byte normalise by UTF-8 bytes, so they "
            "compare across tokenizers; the unigram baseline is scored on the same tokens.", ""]
    out += table(["scorer", "corpus", "bits per byte", "perplexity", "tokens"],
                 [[r["name"], r["corpus"], v(r["bits_per_byte"]), v(r["perplexity"]), v(r["tokens"])]
                  for r in ev["rows"]])
    if ev["samples"]:
        out += ["Greedy samples:", ""]
        out += table(["prompt", "completion"], [[v(x["prompt"]), v(x["completion"])] for x in ev["samples"]])
    return out
