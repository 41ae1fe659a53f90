"""The report's "Authors, contact, funding" and "Citation" sections, from params.yaml's report
section (no ledger facts): who made the model, how to reach them, and a BibTeX entry."""

from __future__ import annotations

import re
from typing import Any

from marin.report.page import Page


def authors(meta: dict[str, Any]) -> str:
    return ", ".join(meta.get("authors") or []) or "authors not recorded"


def bibtex(meta: dict[str, Any]) -> str:
    """A BibTeX entry for the model and its report."""
    names: list[str] = meta.get("authors") or []
    key = re.sub(r"[^A-Za-z0-9]", "", meta["model_name"]) + meta.get("date", "")[:4]
    fields = [("title", f"{meta['model_name']} {meta['version']}: a reproducible language model and its "
                        "transparency report"),
              ("author", " and ".join("{" + a + "}" for a in names) or "{not recorded}"),
              ("year", meta.get("date", "")[:4]), ("version", meta["version"]),
              ("note", f"Model tensor digest {meta['model_tensor_digest']}" if meta.get("model_tensor_digest")
               else "Transparency report built by marin"),
              *([("url", meta["url"])] if meta.get("url") else [])]
    return "@misc{" + key + ",\n" + ",\n".join(f"  {k} = {{{v}}}" for k, v in fields) + "\n}"


def lines(p: Page) -> list[str]:
    meta = p.meta
    return ["## Authors, contact, funding", "", f"- Authors: {authors(meta)}",
            f"- Contact: {meta.get('contact') or 'not recorded'}",
            f"- Funding: {meta.get('funding') or 'not recorded'}",
            f"- Licences: weights {meta['license']}, code {meta.get('code_license', 'not recorded')}", "",
            "## Citation", "", "```bibtex", bibtex(meta), "```", "",
            "The project's own citation metadata is `CITATION.cff` at the root of its repository.", ""]
