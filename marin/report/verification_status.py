"""The report's "Verification status" section: for each run behind the report, the latest full
replay by ``marin verify`` (else the latest segment replay), cited from its ``verification`` record,
and how many verifications the ledger holds."""

from __future__ import annotations

from typing import Any

from marin.ledger.bodies import compared_nothing
from marin.report.facts import Context, Facts
from marin.report.page import Page, table


def facts(f: Facts, c: Context) -> list[dict[str, Any]]:
    """One row per run of the lineage: the fact ids of its strongest, latest verification, or none."""
    out: list[dict[str, Any]] = []
    for log in c.lineage():
        run_id = log.run_id
        vs = [v for v in log.of_kind("verification") if not compared_nothing(v.body_as("verification"))]
        if not vs:
            out.append({"run_id": run_id, "stage": log.stage, "result": None})
            continue
        full = [v for v in vs if v.body_as("verification")["mode"] == "full"]
        v = (full or vs)[-1]  # a full replay says more than segments; the latest of the strongest kind
        vb = v.body_as("verification")
        row: dict[str, Any] = {"run_id": run_id, "stage": log.stage, "verifications": len(vs)}
        if vb["mode"] == "segments":
            row["segments"] = {k: f.cite(f"segments {k}", log, v, f"/body/segments/{k}").id
                               for k in ("k", "n", "seed_source") if k in vb.get("segments", {})}
        out.append({**row,
                    "result": f.cite(f"verification of {run_id}", log, v, "/body/result").id,
                    "mode": f.cite("verification mode", log, v, "/body/mode").id,
                    "when": f.cite("verified at", log, v, "/time").id,
                    "where": f.cite("verifier CPU", log, v, "/body/verifier/env/cpu_model").id,
                    "cores": f.cite("verifier cores", log, v, "/body/verifier/env/usable_cores").id})
    return out


def lines(p: Page) -> list[str]:
    v = p.v
    return ["## Verification status", "", "For each run behind this report (Lineage, below), the latest full replay by "
            "`marin verify` (else the latest segment replay: K of N checkpoint intervals, which catches one "
            "forged interval with probability K/N), and how many verifications the ledger holds.", "",
            *table(["stage", "run", "result", "mode", "when", "verifier CPU", "verifier cores", "verifications"],
                   [[r["stage"], f"`{r['run_id']}`", v(r["result"]), _mode(p, r), v(r.get("when")),
                     v(r.get("where")), v(r.get("cores")), str(r.get("verifications", 0))] if r["result"] else
                    [r["stage"], f"`{r['run_id']}`", "not verified", "", "", "", "", "0"]
                    for r in p.doc["verification"]])]


def _mode(p: Page, r: dict[str, Any]) -> str:
    seg, v = r.get("segments"), p.v
    if not seg:
        return v(r.get("mode"))
    return f"{v(r['mode'])} {v(seg['k'])} of {v(seg['n'])} (seed {v(seg.get('seed_source'))})"
