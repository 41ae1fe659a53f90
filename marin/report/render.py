"""report.md and a self-contained report.html (inline SVG plots) from the gathered facts.

Every value printed is a fact, rendered as a link to its entry under "Sources", which
names the run, the record's seq and digest and the JSON pointer. Rendering is a pure
function of the facts: the same ledger gives the same bytes (plots included: matplotlib's
SVG ids are salted with a constant and the date is left out). Each section is a module whose
``lines`` render it (and whose ``facts`` gather it: :mod:`marin.report.gather`); report.md is
the sections of :data:`SECTIONS`, in order.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from marin.report import (
    compute,
    data,
    environment,
    evaluation,
    experiments,
    harness_section,
    instruct,
    lineage,
    memorisation,
    model,
    people,
    proves,
    references_section,
    sources,
    training,
    usage,
    verification_status,
    verifications,
)
from marin.report.facts import Fact
from marin.report.page import Page

# report.md, top to bottom: each section's lines
SECTIONS: tuple[Callable[[Page], list[str]], ...] = (
    model.lines,  # the title and Summary
    usage.lines,  # How to use, Intended use, Limitations, Risks
    data.lines, training.lines, compute.lines, evaluation.lines, harness_section.lines, references_section.lines,
    experiments.lines, environment.lines, verification_status.lines, proves.lines, verifications.lines,
    instruct.lines, memorisation.lines, lineage.lines, people.lines, sources.lines)


def markdown(facts: dict[str, Fact], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """report.md: summary, how to use, uses and risks, data, training, compute, evaluation,
    environment, verification, lineage, people and citation, sources."""
    page = Page(facts, doc, meta)
    return "\n".join(line for section in SECTIONS for line in section(page)).rstrip() + "\n"


STYLE = """body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;max-width:1180px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em;
display:block;max-width:100%;overflow-x:auto}pre{overflow-x:auto;background:#f5f7fa;padding:.6em}
td,th{border:1px solid #ccd;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#eef2f8}
code{font-size:.9em;word-break:break-all}a{color:#1f5fa8;text-decoration:none}a:hover{text-decoration:underline}
figure{margin:0}svg{max-width:100%;height:auto}h1{font-size:1.6em}h2{border-bottom:1px solid #ccd}
.sources table{font-size:.74em}.sources td{padding:.1em .4em}.sources code{word-break:normal}
.sources td:nth-child(-n+3){white-space:nowrap}
figure.plot svg{max-width:640px}"""


def html_page(md_text: str, facts: dict[str, Fact], figures: dict[str, str], title: str) -> str:
    """The Markdown as one self-contained HTML page: figures inline, each fact link titled with its source."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(md_text)
    for key, svg in figures.items():
        img = f'<img src="figures/{key}.svg" alt="'
        start = body.find(img)
        if start >= 0:
            end = body.index(">", start) + 1
            body = body[:start] + '<figure class="plot">' + svg[svg.index("<svg"):] + "</figure>" + body[end:]
    for f in facts.values():
        src = f.source
        tip = (f"{src['formula']}" if "formula" in src else f"{src['vsa']} {src['file_digest']}" if "vsa" in src
               else f"{src['run_id']} seq {src['seq']} {src['record']}")
        body = body.replace(f'<a href="#{f.id}">', f'<a href="#{f.id}" title="{html.escape(tip)}">')
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")

