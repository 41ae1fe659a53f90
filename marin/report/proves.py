"""The report's "What verification proves" section: what each check establishes and what it cannot
(the table of docs/guide/ledger.md, where the report's reader finds it), and the conditions of
"bit for bit" for this report's runs: for each JAX run, its determinism profile (which CPUs give the
same bits), its process × device layout and its XLA CPU threads, each a fact cited from the run's
``run.started`` record, so ``marin report verify`` re-derives them."""

from __future__ import annotations

from typing import Any, cast

from marin.report.facts import Context, Facts
from marin.report.page import Page, V

DC = "/body/determinism_class"

CHECKS = (
    ("`marin ledger check`",
     "every record is the exact bytes of a record valid under the pinned schemas; every run's hash chain and "
     "Merkle root hold; every output on disk is a version some run recorded",
     "that the records are true: whoever holds the files can rewrite a whole run consistently"),
    ("`marin ledger check --since reports/…/ledger_head.json`",
     "every run of the snapshot this report was built from is still there, unchanged or only extended",
     "anything about runs created after the snapshot"),
    ("`marin verify RUN` (bit-exact)",
     "replaying the run from its recorded commit, params, inputs and determinism class gives the same bits: "
     "every output, checkpoint, metric and eval value, under the conditions below",
     "runs recorded with uncommitted code (refused); a replay in another determinism class (another profile, "
     "CPU level, layout or thread count) is reported as distances, never as bit-exact; `--segments K` checks "
     "only K of N intervals (a forged interval is caught with probability K/N)"),
    ("`marin report verify DIR`",
     "the report's signature, that every file is what the signed statement lists, that every number is "
     "re-derived from the ledger record it cites",
     "that the ledger it cites is true: combine it with `ledger check --since` and `marin verify`"),
    ("a signed verification summary (VSA, `marin verify --sign`; Independent verification, below)",
     "that the holder of a key the lab vouches for replayed that run and got the result the summary states",
     "more than its signer's word; a key nobody vouches for (`verifications/verifiers.json`, `--trust`) "
     "counts for nothing"),
)


def facts(f: Facts, c: Context) -> list[dict[str, Any]]:
    """For each JAX run of the lineage, the facts (ids) that state its bit-for-bit conditions."""
    rows: list[dict[str, Any]] = []
    for log in c.lineage():
        s, started = log.start, log.start_body
        det = started["determinism_class"]
        if det.get("kind") != "jax":
            continue
        stage = started["stage"]
        row: dict[str, Any] = {"stage": stage, "run_id": log.run_id,
                               "profile": f.cite(f"{stage} determinism profile", log, s, f"{DC}/profile").id,
                               "native": det.get("profile") == "native",
                               "devices": f.cite(f"{stage} devices", log, s, f"{DC}/device_count").id,
                               "backend": f.cite(f"{stage} backend", log, s, f"{DC}/backend").id,
                               "threads": f.cite(f"{stage} XLA CPU threads", log, s, f"{DC}/xla_cpu_threads").id}
        if det.get("profile") == "portable" and "isa_level" in det:
            row["isa_level"] = f.cite(f"{stage} portable ISA level", log, s, f"{DC}/isa_level").id
        elif det.get("profile") == "universal" and "tau" in det:  # float64 steps rounded with a log: any CPU
            row["tau"] = f.cite(f"{stage} universal rounding threshold", log, s, f"{DC}/tau").id
        else:  # native: the kernels dispatch on this CPU's features; name the CPU they were read on
            row["cpu"] = f.cite(f"{stage} CPU", log, s, "/body/env/cpu_model").id
        if "processes" in det.get("mesh", {}):
            row["processes"] = f.cite(f"{stage} processes", log, s, f"{DC}/mesh/processes").id
            row["per_process"] = f.cite(f"{stage} devices per process", log, s, f"{DC}/mesh/devices_per_process").id
        rows.append(row)
    return rows


def _cpus(v: V, r: dict[str, Any]) -> str:
    if "isa_level" in r:
        return f"any {v(r['isa_level'])} CPU (the portable profile pins the kernels to that level)"
    if "tau" in r:
        return (f"any x86-64 or aarch64 CPU (the universal profile rounds float64 steps to float32 and logs the "
                f"values within {v(r['tau'])} float32 ulps of a rounding midpoint)")
    return f"this CPU only ({v(r.get('cpu'))}, the native profile's kernels use its own features)"


def _layout(v: V, r: dict[str, Any]) -> str:
    if "processes" in r:
        return f"{v(r['processes'])} processes × {v(r['per_process'])} devices ({v(r['backend'])})"
    return f"1 × {v(r['devices'])} ({v(r['backend'])}; one process: a class names processes only above one)"


def lines(p: Page) -> list[str]:
    """The section of report.md: the checks table, then the bit-for-bit conditions of each JAX run."""
    v, rows = p.v, cast(list[dict[str, Any]], p.doc.get("proves") or [])
    out = ["## What verification proves", "",
           "Each check a reader can run, what it proves and what it cannot (the same table as the guide's "
           "\"What each check proves\").", "", "| check | proves | cannot prove |", "|---|---|---|"]
    out += [f"| {c} | {p} | {n} |" for c, p, n in CHECKS]
    out += ["", "\"Bit for bit\" holds within a determinism class: a CPU the profile admits, and the process × "
            "device layout and XLA thread count the run recorded (its `run.started` record holds the whole class; "
            "Environment, above, shows the train run's). The JAX runs of this report:", "",
            "| stage | run | profile | CPUs that give the same bits | processes × devices | XLA CPU threads |",
            "|---|---|---|---|---|---|"]
    out += [f"| {r['stage']} | `{r['run_id']}` | {v(r['profile'])} | {_cpus(v, r)} | {_layout(v, r)} | "
            f"{v(r['threads'])} |" for r in rows]
    out += ["", "The data stages (fetch, curate, tokenize and the others without a profile) run pure Python, Arrow "
            "and Rust code: their bits depend on the library versions (pinned by `uv.lock`, its digest in each run's "
            "code record) and the platform, not on the CPU's features.", ""]
    return out
