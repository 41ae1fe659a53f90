"""A signed report stays verifiable after later runs (issue 41): `marin report verify` re-renders it
from the ledger as its signed snapshot holds it, so a later evaluation, a later verification and a
later run of any stage change nothing it checks; a file edited after signing still fails."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import Project
from tests.test_verify import run_file, run_id

pytestmark = pytest.mark.slow


def test_a_signed_report_verifies_after_later_runs_and_still_catches_an_edit(trained_project: Project) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    proj.marin("report", check=True)
    out = proj.root / "reports" / "marin-tiny"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert proj.marin("report", "verify", str(out)).returncode == 0
    # later work: a verification appended to a run the report cites, a new evaluation of the same model
    assert proj.marin("verify", run_id(run_file(proj, "fetch"))).returncode == 0
    params = proj.params
    params["evaluate"]["harness"]["seed"] = params["evaluate"]["harness"].get("seed", 1234) + 1
    proj.write_params(params)
    proj.stage("evaluate")
    assert len(proj.runs("evaluate")) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing rewritten
    kept = proj.root / "reports" / "published"  # the signed report as published, beside a rebuild
    shutil.copytree(out, kept)
    proj.marin("report", check=True)  # a new report over the later runs says something else
    assert (out / "report.md").read_bytes() != before["report.md"]
    r = proj.marin("report", "verify", str(kept))
    assert r.returncode == 0 and "signature ok" in r.stdout, r.stdout + r.stderr
    later = proj.runs("evaluate")[-1][0]["run_id"]  # oldest first
    fetch = run_id(run_file(proj, "fetch"))
    stale = next(line for line in r.stdout.splitlines() if line.startswith("stale: "))
    assert stale == (f"stale: 1 newer run ({later}), records added since to 1 of its runs ({fetch}); "
                     "`marin report` rebuilds it"), stale  # the later report runs are not counted
    assert "stale" not in proj.marin("report", "verify", str(out), check=True).stdout  # the rebuild is current
    assert proj.marin("ledger", "check", "--since", str(kept)).returncode == 0
    # a fact edited after signing is still named: the file's digest, the fact against its source, the re-render
    doc = json.loads((kept / "report.json").read_text())
    fid, fact = next((k, f) for k, f in sorted(doc["facts"].items()) if isinstance(f["value"], int)
                     and not isinstance(f["value"], bool) and f["text"] in (kept / "report.md").read_text())
    was, fact["value"] = fact["text"], fact["value"] + 1
    fact["text"] = str(fact["value"])
    (kept / "report.json").write_text(json.dumps(doc))
    md = kept / "report.md"
    md.write_text(md.read_text().replace(was, fact["text"], 1))
    bad = proj.marin("report", "verify", str(kept))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "report.json: changed since it was signed" in bad.stderr, bad.stderr
    assert f"fact {fid} ({fact['label']}): the report says {fact['text']}" in bad.stderr, bad.stderr
