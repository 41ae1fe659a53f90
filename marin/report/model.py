"""The report's title and Summary: the model (its path, digests, parameters, steps and architecture),
each cited from the train run's ``run.started`` record and its ``model`` output record."""

from __future__ import annotations

from typing import Any

from marin.report.facts import Context, Facts, esc, output
from marin.report.page import Page
from marin.report.people import authors


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """Fact ids of the model's digests, size and architecture."""
    log = c.logs["train"]
    s, out = log.start, output(log, "model")
    p = "/body/params/model"
    arch = {k: f.cite(f"model.{k}", log, s, f"{p}/{esc(k)}").id for k in log.params["model"]}
    return {"path": out.body_as("output")["path"],
            "tensor_digest": f.cite("model tensor digest", log, out, "/body/tensor_digest").id,
            "folder_digest": f.cite("model folder digest", log, out, "/body/digest").id,
            "n_params": f.cite("parameters", log, out, "/body/meta/n_params").id,
            "steps": f.cite("optimizer steps", log, out, "/body/meta/step").id, "architecture": arch,
            "recipe_digest": f.cite("train recipe digest", log, s, "/body/recipe_digest").id}


def lines(p: Page) -> list[str]:
    """The title, what the report is, and the Summary."""
    m, tr, meta, v = p.doc["model"], p.doc["training"], p.meta, p.v
    return [f"# Transparency report: {meta['model_name']} {meta['version']}", "",
            f"By {authors(meta)}. Built by `marin report` from the ledger alone: every number links to the ledger "
            "record it came from (see [Sources](#sources)), and `marin report verify` re-derives all of them and "
            "checks the in-toto provenance (`provenance.intoto.json`) and, when it is signed, its signature.", "",
            "## Summary", "",
            f"A decoder-only transformer (Llama architecture) with {v(m['n_params'])} parameters, trained from "
            f"scratch for {v(m['steps'])} optimizer steps on {v(tr['tokens_seen'])} tokens. Weights: `{m['path']}`"
            f", tensor digest {v(m['tensor_digest'])}; train recipe {v(m['recipe_digest'])}.", "",
            "The model has two digests. The **tensor digest** is the sha256 over its tensors (names, dtypes, "
            "shapes, bytes): the model's identity, the same in every file format, and the subject of the signed "
            f"provenance. The **folder digest** {v(m['folder_digest'])} is the sha256 of the list of files in "
            f"`{m['path']}`: what the ledger, `marin lineage` and DVC track.", ""]
