"""The report's Lineage section: the runs behind the report (``doc["lineage"]``, gathered by
:func:`marin.report.gather.gather`), their status, recipe digest and commit."""

from __future__ import annotations

from marin.report.page import Page, short, table


def lines(p: Page) -> list[str]:
    return ["## Lineage", "", "The runs behind this report: the model's own lineage, the evaluation, export and "
            "instruct runs that read the model, and the runs behind those (W3C PROV-JSON: `lineage.prov.json`).", "",
            *table(["stage", "run", "status", "recipe digest", "git commit"],
                   [[r["stage"], f"`{r['run_id']}`", r["status"], short(r["recipe_digest"]),
                     short(r["git_commit"] or "?")] for r in p.doc["lineage"]])]
