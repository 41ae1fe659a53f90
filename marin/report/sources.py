"""The report's appendix "Sources": every fact with the record (run, seq, digest) and the JSON pointer
it was read at, or the formula and inputs it was derived by; and the metric records behind each figure."""

from __future__ import annotations

from marin.report.facts import Fact, md_escape
from marin.report.page import Page, short, table
from marin.report.training import CURVES, figure_source


def lines(p: Page) -> list[str]:
    # a plain heading: its anchor, #appendix-sources, is the one the Hub and GitHub make (cards link to it)
    c = p.doc["training"]["curve"]
    return ['<a id="sources"></a>', "", "## Appendix: Sources", "",
            "Each fact: the ledger run and record (seq; the record's digest, shortened: hover for all of it, "
            "report.json holds every digest in full) and the JSON pointer to the value, in the record or in a "
            "recorded output file; derived values name their formula.", "",
            '<div class="sources">', "",
            *table(["fact", "what", "record", "value at"], [_row(f) for f in p.facts.values()]),
            "</div>", "", "Figures:", "",
            *table(["figure", "run", "metric records (seq)", "digest of their record digests"],
                   [[f'<a id="figure-{key}"></a>{key}', f"`{c['run_id']}`",
                     f"{c['records'][0]['seq']}–{c['records'][-1]['seq']}" if c["records"] else "none",
                     short(figure_source(c))] for key, _ in CURVES])]


def _row(f: Fact) -> list[str]:
    src, anchor = f.source, f'<a id="{f.id}"></a>{f.id}'
    if "formula" in src:
        where = f"{src['formula']} of " + ", ".join(f"[{i}](#{i})" for i in src["inputs"])
        return [anchor, md_escape(f.label), "derived", where]
    if "vsa" in src:  # a signed verification summary: the file, its digest, the pointer into its statement
        return [anchor, md_escape(f.label), f"`{src['vsa']}` {short(src['file_digest'], 8)}",
                f"statement `{src['pointer']}`"]
    ptr = f"`{src['file']}` {short(src['file_digest'], 8)} `{src['pointer']}`" if "file" in src \
        else f"`{src['pointer']}`"
    return [anchor, md_escape(f.label), f"`{src['run_id']}` seq {src['seq']} {short(src['record'], 8)}", ptr]
