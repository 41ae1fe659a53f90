"""The report's reader-facing sections: what verification proves under which conditions (each run's
determinism class, read here from the ledger directly), what the compute figures leave out, every
package that produced a number, and heading ids with a contents list that resolve in report.html."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
import yaml

from tests.conftest import Project
from tests.test_verify import records, run_file

pytestmark = pytest.mark.slow
FACT = re.compile(r"\]\(#(F\d+)\)")


def _section(md: str, title: str) -> str:
    return md.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _started(proj: Project, stage: str) -> dict:
    return next(r["body"] for r in records(run_file(proj, stage)) if r["kind"] == "run.started")


def test_what_verification_proves_states_each_runs_class_and_what_it_leaves_out(reported) -> None:
    proj, out = reported
    md = (out / "report.md").read_text()
    facts = json.loads((out / "report.json").read_text())["facts"]
    sec = _section(md, "What verification proves")
    for check in ("| `marin ledger check` |", "| `marin verify RUN` (bit-exact) |", "| `marin report verify DIR` |",
                  "| a signed verification summary ("):
        [row] = [x for x in sec.splitlines() if x.startswith(check)]
        assert len(row.split(" | ")) == 3 and all(len(c) > 20 for c in row.split(" | ")), row  # proves, cannot
    for stage in ("train", "evaluate"):  # the JAX runs of this project, their class read from the ledger here
        start, run_id = _started(proj, stage), records(run_file(proj, stage))[0]["run_id"]
        det = start["determinism_class"]
        [row] = [x for x in sec.splitlines() if x.startswith(f"| {stage} | `{run_id}` |")]
        cited = [facts[fid]["value"] for fid in FACT.findall(row)]
        assert cited[0] == det["profile"] and cited[-1] == det["xla_cpu_threads"] and det["device_count"] in cited
        if det["profile"] == "portable":
            assert cited[1] == det["isa_level"] and "any [" in row
        else:
            assert cited[1] == start["env"]["cpu_model"] and "this CPU only" in row
        assert ("processes" in det["mesh"]) == (det["mesh"].get("processes") in cited)
    for stage in ("fetch", "curate", "tokenize"):  # data stages have no profile: no row
        assert f"| {stage} | `" not in sec
    compute = _section(md, "Compute")
    assert all(w in compute for w in ("process start", "imports", "DVC's own hashing", "wall_s"))
    # lm-eval made the Benchmarks numbers: its recorded version is in the package list, a cited fact
    harness = {r["body"]["values"].get("harness_version") for r in records(run_file(proj, "evaluate"))
               if r["kind"] == "eval" and r["body"]["name"].startswith("harness:")} - {None}
    [packages] = [x for x in _section(md, "Environment and determinism class").splitlines()
                  if x.startswith("| packages |")]
    shown = re.search(r"lm-eval \(evaluate run\) \[[^\]]+\]\(#(F\d+)\)", packages)
    assert len(harness) == 1 and shown and facts[shown.group(1)]["value"] in harness, packages


def test_every_heading_has_an_id_and_the_contents_and_every_link_resolve(reported) -> None:
    _, out = reported
    md = (out / "report.md").read_text()
    page = re.sub(r"<svg.*?</svg>", "", (out / "report.html").read_text(), flags=re.S)  # the figures' own ids
    head = md.split("\n## Summary\n", 1)[0]
    contents = head.split("**Contents**", 1)[1]
    targets = re.findall(r"\]\(#([^)]+)\)", contents)
    lines, fenced, ids = md.splitlines(), False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{2,3} ", line):
            m = re.fullmatch(r'<a id="([^"]+)"></a>', lines[i - 2])
            assert m and lines[i - 1] == "", (line, lines[i - 2])
            ids.append(m.group(1))
    assert len(ids) == len(set(ids)) > 15 and targets == ids  # every heading, in order, once
    assert "summary" in ids and "what-verification-proves" in ids and "sources" in ids
    # report.html: the id on each heading itself, and every in-page link lands on an element with that id
    html_ids = re.findall(r'\bid="([^"]+)"', page)
    heading_ids = re.findall(r'<h[23] id="([^"]+)">', page)
    assert heading_ids == ids and len(html_ids) == len(set(html_ids))
    assert not re.search(r"<h[23]>", page), "a heading without an id"
    missing = set(re.findall(r'href="#([^"]+)"', page)) - set(html_ids)
    assert not missing, sorted(missing)[:5]


def test_compute_fmti_and_mof_say_what_was_measured_what_was_estimated_and_the_class_with_why(reported) -> None:
    proj, out = reported
    md, rep = (out / "report.md").read_text(), json.loads((out / "report.json").read_text())
    facts, doc = rep["facts"], rep["doc"]
    runs = {r["run_id"]: records(proj.root / "ledger" / "runs" / f"{r['run_id']}.jsonl") for r in doc["lineage"]}
    finished = {k: next(r for r in v if r["kind"] == "run.finished") for k, v in runs.items()}
    # Compute: the process CPU time the runs measured, the sum of their run.finished cpu_s read here
    [row] = [x for x in _section(md, "Compute").splitlines() if x.startswith("| process CPU time (s), measured")]
    assert f"{len(runs)} of the {len(runs)} runs" in row and "`os.times()`" in row
    assert facts[FACT.findall(row)[-1]]["value"] == round(sum(f["body"]["cpu_s"] for f in finished.values()), 3)
    # FMTI: the final training run's own estimate, from its wall time and cores and params.yaml's assumptions
    fmti = {r["indicator"]: r for r in csv.DictReader(io.StringIO((out / "fmti.csv").read_text()))}
    [train] = proj.runs("train")
    tid, e = train[0]["run_id"], proj.params["report"]["energy"]
    cores = len(next(r for r in train if r["kind"] == "run.started")["body"]["env"]["usable_cores"])
    kwh = finished[tid]["body"]["wall_s"] * cores / 3600 * e["cpu_watts_per_core"] * e["pue"] / 1000
    energy = fmti["Energy usage for final training run"]
    assert energy["disclosure"].startswith("not measured: no power meter or energy counter is read. Estimate: ")
    assert f"{kwh:.3g} kWh for the final training run {tid}," in energy["disclosure"]
    assert "process CPU time" in energy["disclosure"] and f"{tid}#{finished[tid]['seq']}" in energy["evidence"]
    assert "an estimate, not counted" in fmti["Compute usage for final training run"]["disclosure"]
    # MOF: the evaluation rows hold the harness; the class with the components that missed the next one
    mof = yaml.safe_load((out / "mof.yml").read_text())
    comps = {c["name"]: c for c in mof["release"]["components"]}
    assert "lm-evaluation-harness" in comps["Evaluation code"]["description"]
    assert all((proj.root / p).exists() for p in comps["Evaluation data"]["location"].split(", "))
    assert "data/evalsets" in comps["Evaluation data"]["location"]
    cls = mof["classification"]
    assert cls["class"] == "Class II - Open Tooling" and cls["next_class"]["class"] == "Class I - Open Science"
    assert "Research paper: not included" in cls["next_class"]["missed_because"]
    assert proj.marin("report", "verify", str(out)).returncode == 0  # the new facts re-derive
