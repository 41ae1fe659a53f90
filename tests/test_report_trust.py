"""The report's trust gaps, closed: it reads only project files (vendored reference data,
recorded by digest), it is a ledger run like every stage, a fact whose source is gone is named
as missing, and a clone without a signing key still gets a report, said to be unsigned."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import rfc8785
import yaml

from marin.attest import keyring
from marin.ledger.merkle import merkle_root
from tests.conftest import PINNED, Project, copy_project, reference
from tests.test_verify import records, run_file

pytestmark = pytest.mark.slow
REPORT = "reports/marin-tiny"
VENDORED = {"fmti_indicators": "marin/report/reference/fmti-indicators-dec2025.csv",
            "mof_licenses": "marin/report/reference/mof-licenses.json"}


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def statement(out: Path) -> dict:
    return json.loads(base64.b64decode(json.loads((out / "provenance.intoto.json").read_text())["payload"]))


def keyed(proj: Project) -> Project:
    """The project with a signing key (where the key is not what a test is about)."""
    proj.marin("keygen", check=True)
    return proj


def report_runs(proj: Project) -> list[list[dict]]:
    return proj.runs("report")


def no_shared_beside(proj: Project) -> None:
    """No ``shared`` folder beside the project or above it: the report must not need one."""
    for d in proj.root.parents:
        assert not (d / "shared").exists(), d


# -- 11: reference data inside the project ----------------------------------------------------


def test_vendored_reference_files_are_the_upstream_copies() -> None:
    repo = Path(__file__).resolve().parents[1]
    for name in ("fmti-indicators-dec2025.csv", "fmti-indicators-2024.csv", "mof-licenses.json"):
        reference(name)  # the copy is byte for byte the pinned upstream file
    listed = dict(line.split()[::-1] for line in (repo / "marin/report/reference/README.md").read_text().splitlines()
                  if len(line.split()) == 2 and len(line.split()[0]) == 64)
    assert listed == {k.rsplit("/", 1)[1]: v for k, v in PINNED.items() if k.startswith("marin/report/reference/")}
    notice = (repo / "marin/report/reference/NOTICE").read_text()
    assert "CC-BY-4.0" in notice and "MIT" in notice and "stanford-crfm/fmti" in notice
    assert "Copyright 2024 The Model Openness Tool Authors" in (repo / "marin/report/reference/LICENSE-MIT").read_text()
    params = (repo / "params.yaml").read_text()
    assert "../shared" not in params and "shared/vendor" not in params


def test_a_report_built_in_one_clone_verifies_in_another_without_shared(trained_project: Project,
                                                                        tmp_path: Path) -> None:
    a = copy_project(trained_project, tmp_path / "one" / "proj")
    b_dir = tmp_path / "two" / "deeper" / "still" / "proj"  # another depth: ../shared is never there
    no_shared_beside(a)
    a.marin("keygen", check=True)
    a.marin("report", check=True)
    pub = tmp_path / "publisher.pub"
    shutil.copy(a.root / ".marin/keys/report.key.pub", pub)
    b = copy_project(a, b_dir)
    shutil.rmtree(b.root / ".marin/keys")  # the second clone has no key, only the publisher's public key
    no_shared_beside(b)
    with open(reference("fmti-indicators-dec2025.csv"), newline="", encoding="utf-8-sig") as fh:
        upstream = [(r["Domain"].strip(), r["Subdomain"].strip(), r["Indicator"].strip()) for r in csv.DictReader(fh)]
    rows = list(csv.DictReader((b.root / REPORT / "fmti.csv").open(encoding="utf-8")))
    assert len(upstream) == 100 and [(r["domain"], r["subdomain"], r["indicator"]) for r in rows] == upstream
    assert 10 <= sum(r["disclosed"] == "yes" for r in rows) < 100
    r = b.marin("report", "verify", REPORT, "--key", str(pub), "--require-signature")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "signature ok" in r.stdout
    # rebuilt in the second clone (unsigned there): the same FMTI and MOF bytes
    b.stage("report")
    for name in ("fmti.csv", "mof.yml", "report.md", "report.json"):
        assert (a.root / REPORT / name).read_bytes() == (b.root / REPORT / name).read_bytes(), name
    # every reference file is recorded by digest: report.json, the statement, the run's inputs
    refs = json.loads((b.root / REPORT / "report.json").read_text())["references"]
    assert {k: v["path"] for k, v in refs.items()} == VENDORED
    assert all(v["digest"] == sha256(b.root / v["path"]) for v in refs.values())
    predicate = statement(b.root / REPORT)["predicate"]
    deps = {d.get("name"): d for d in predicate["buildDefinition"]["resolvedDependencies"]}
    for key, path in VENDORED.items():
        assert deps[f"reference:{key}"]["digest"]["sha256"] == sha256(b.root / path)[7:]
        assert deps[f"reference:{key}"]["uri"] == path


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_a_reference_path_outside_the_project_is_refused(trained_project: Project, where: str,
                                                         tmp_path: Path) -> None:
    keyed(trained_project)
    params = trained_project.params
    outside = str(tmp_path / "fmti-indicators-dec2025.csv")
    shutil.copy(reference("fmti-indicators-dec2025.csv"), outside)
    params["report"]["fmti_indicators"] = outside if where == "absolute" else "../outside/x.csv"
    trained_project.write_params(params)
    r = trained_project.stage("report", check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "report.fmti_indicators" in line and "outside the project" in line
    assert "marin/report/reference/fmti-indicators-dec2025.csv" in line  # what to use instead
    assert not report_runs(trained_project) and not (trained_project.root / "reports").exists()


def test_a_missing_reference_file_is_an_error_not_a_fallback(trained_project: Project) -> None:
    keyed(trained_project)
    (trained_project.root / VENDORED["mof_licenses"]).unlink()
    r = trained_project.stage("report", check=False)
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert "report.mof_licenses" in line and VENDORED["mof_licenses"] in line and "git checkout" in line
    assert not (trained_project.root / "reports").exists()


def test_verify_names_a_reference_file_changed_after_the_report(trained_project: Project) -> None:
    keyed(trained_project)
    trained_project.stage("report")
    path = trained_project.root / VENDORED["fmti_indicators"]
    path.write_bytes(path.read_bytes().replace(b"Data size", b"Data volume", 1))
    r = trained_project.marin("report", "verify", REPORT)
    assert r.returncode == 1
    assert f"reference fmti_indicators: {VENDORED['fmti_indicators']} hashes to {sha256(path)}" in r.stderr


# -- 12: the report is a ledger run ----------------------------------------------------------


def head_root(leaves: list[dict]) -> str:
    """RFC 6962 root over canonical {run_id, seq, digest} leaves, computed here, not by marin."""
    return "sha256:" + merkle_root([rfc8785.dumps(x) for x in leaves]).hex()


def test_the_report_is_a_ledger_run_with_its_inputs_and_outputs(trained_project: Project) -> None:
    proj = trained_project
    before = {name.removesuffix(".jsonl"): [json.loads(x) for x in data.splitlines()][-1]
              for name, data in proj.ledger_files().items()}
    proj.marin("keygen", check=True)
    proj.env["MARIN_MLFLOW"] = "on"
    proj.stage("report")
    [run] = report_runs(proj)
    started, inputs = run[0], {r["body"]["name"]: r["body"] for r in run if r["kind"] == "input"}
    assert started["body"]["stage"] == "report" and run[-1]["body"]["status"] == "succeeded"
    assert set(inputs) == {"ledger_head", "fmti_indicators", "mof_licenses", "signing_key"}
    assert {i["name"] for i in started["body"]["inputs"]} == set(inputs)
    out = proj.root / REPORT
    # the ledger head: every run before the report, by its last record; the report run left out
    snap = json.loads((out / "ledger_head.json").read_text())
    leaves = [{"run_id": k, "seq": v["seq"], "digest": v["digest"]} for k, v in sorted(before.items())]
    assert snap["leaves"] == leaves and snap["runs"] == len(before) and snap["root"] == head_root(leaves)
    assert inputs["ledger_head"] | {"size": 0} == {"name": "ledger_head", "path": "ledger/runs", "size": 0,
                                                  "runs": len(before), "digest": snap["root"],
                                                  "digest_of": "ledger_head"}
    dep = next(d for d in statement(out)["predicate"]["buildDefinition"]["resolvedDependencies"]
               if d.get("uri") == "marin:ledger")
    assert dep["digest"]["sha256"] == snap["root"][7:] and dep["annotations"]["runs"] == len(before)
    assert "ledger_head.json" in {s["name"] for s in statement(out)["subject"]}
    # the reference files by digest; the key by fingerprint (the envelope's keyid), never the key
    for key, path in VENDORED.items():
        assert inputs[key]["path"] == path and inputs[key]["digest"] == sha256(proj.root / path)
    keyid = json.loads((out / "provenance.intoto.json").read_text())["signatures"][0]["keyid"]
    assert inputs["signing_key"]["digest"] == f"sha256:{keyid}" and inputs["signing_key"]["digest_of"] == "public_key"
    private = (proj.root / ".marin/keys/report.key").read_text()
    assert "PRIVATE" not in json.dumps(run) and private.splitlines()[1] not in json.dumps(run)
    # outputs: the report directory (every file an entry) and its envelope, snapshot, report.json
    outputs = {r["body"]["name"]: r["body"] for r in run if r["kind"] == "output"}
    assert {e["path"] for e in outputs["report"]["entries"]} == {
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert outputs["provenance"]["digest"] == sha256(out / "provenance.intoto.json")
    assert outputs["ledger_head"]["digest"] == sha256(out / "ledger_head.json")
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    grown = proj.marin("ledger", "check", "--since", REPORT)  # the snapshot signed in the report
    assert grown.returncode == 0, grown.stdout + grown.stderr
    intact = f"snapshot {snap['root'][:19]}… ({len(before)} runs, report signature ok) intact"
    assert intact in grown.stdout, grown.stdout
    # a received copy whose snapshot was edited consistently (a run dropped, the root recomputed) is not believed
    forged = proj.root.parent / "received"
    shutil.copytree(out, forged)
    doc = json.loads((forged / "ledger_head.json").read_text())
    doc["leaves"], doc["runs"] = doc["leaves"][1:], doc["runs"] - 1
    doc["root"] = head_root(doc["leaves"])
    (forged / "ledger_head.json").write_text(json.dumps(doc))
    r = proj.marin("ledger", "check", "--since", str(forged))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert f"{forged}/ledger_head.json: changed since it was signed" in r.stderr and "cannot be trusted" in r.stderr
    from tests.test_tracking import store

    client, exp = store(proj)  # mirrored into MLflow like every stage
    [m] = [x for x in client.search_runs([exp]) if x.data.tags.get("marin.stage") == "report"]
    assert m.data.tags["marin.run_id"] == started["run_id"] and m.info.status == "FINISHED"
    assert {d.dataset.name for d in m.inputs.dataset_inputs} == set(inputs)


def test_lineage_and_a_second_report_are_unaffected_by_report_runs(trained_project: Project) -> None:
    keyed(trained_project)
    proj = trained_project
    proj.stage("report")
    first = (proj.root / REPORT / "report.md").read_bytes()
    proj.stage("report")
    runs = report_runs(proj)
    assert len(runs) == 2
    snap = json.loads((proj.root / REPORT / "ledger_head.json").read_text())
    ids = {x["run_id"] for x in snap["leaves"]}
    assert runs[0][0]["run_id"] in ids and runs[1][0]["run_id"] not in ids  # the earlier run, not itself
    assert (proj.root / REPORT / "report.md").read_bytes() == first  # content does not depend on report runs
    lineage = proj.marin("lineage", "models/final")
    assert lineage.returncode == 0 and "report" not in lineage.stdout
    r = proj.marin("report", "verify", REPORT)
    assert r.returncode == 0, r.stdout + r.stderr


# -- 13: a fact whose source is gone ---------------------------------------------------------


def test_verify_names_the_missing_source_when_a_run_file_is_removed(trained_project: Project) -> None:
    keyed(trained_project)
    proj = trained_project
    proj.stage("report")
    path = run_file(proj, "evaluate")
    rec = next(r for r in records(path) if r["kind"] == "eval" and r["body"]["name"] == "model"
               and "corpus" not in r["body"])
    facts = json.loads((proj.root / REPORT / "report.json").read_text())["facts"]
    [fid] = [k for k, f in facts.items() if f["label"] == "model all bits_per_byte"]
    path.unlink()
    r = proj.marin("report", "verify", REPORT)
    assert r.returncode == 1
    assert (f"fact {fid} (model all bits_per_byte): its source {path.name} seq {rec['seq']} is gone "
            "(run file deleted?)") in r.stderr
    assert f"{path.name}: in the snapshot" in r.stderr  # ledger_head.json knew the run
    python = next(x["body"]["env"]["python"] for x in records(run_file(proj, "train")) if x["kind"] == "run.started")
    assert f"says {python}" not in r.stderr  # never resolved against another record


# -- 17.2: no key, no failure ------------------------------------------------------------------


def test_without_a_key_the_stage_writes_an_unsigned_report(trained_project: Project, tmp_path: Path) -> None:
    from in_toto_attestation.v1.statement import Statement
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    proj = trained_project
    assert not (proj.root / ".marin/keys").exists()
    done = proj.stage("report")
    [line] = [x for x in done.stdout.splitlines() if x.startswith("report: wrote ")]  # the other: the release line
    assert "NOT SIGNED" in line and ".marin/keys/report.key" in line and "marin keygen" in line
    out = proj.root / REPORT
    envelope = json.loads((out / "provenance.intoto.json").read_text())
    assert envelope["signatures"] == []
    from tests.test_attest import _sslib_key

    _, pub = keyring.keygen(tmp_path / "any.key")
    with pytest.raises(VerificationError):  # DSSE tooling reads it, and finds no signature to trust
        Envelope.from_dict(envelope).verify([_sslib_key(pub)], 1)
    stmt = statement(out)
    from tests.test_report import _subjects

    Statement(_subjects(stmt), stmt["predicateType"], stmt["predicate"]).validate()
    r = proj.marin("report", "verify", REPORT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not signed" in r.stdout and "facts re-derived from the ledger: ok" in r.stdout
    r = proj.marin("report", "verify", REPORT, "--require-signature")
    assert r.returncode == 1 and "not signed" in r.stderr and "--require-signature" in r.stderr
    # still every file checked: an edited file is named even without a signature
    (out / "fmti.csv").write_text((out / "fmti.csv").read_text().replace(",no,", ",yes,", 1))
    r = proj.marin("report", "verify", REPORT)
    assert r.returncode == 1 and "fmti.csv: changed since it was written" in r.stderr
    # with a key: signed as before
    proj.marin("keygen", check=True)
    done = proj.stage("report")
    assert "signed: provenance.intoto.json" in done.stdout
    r = proj.marin("report", "verify", REPORT, "--require-signature")
    assert r.returncode == 0 and "signature ok" in r.stdout, r.stdout + r.stderr


def test_dvc_repro_without_a_key_writes_an_unsigned_report_and_checks(_shipped, tmp_path: Path) -> None:
    """A clone has no key (it is never committed): ``dvc repro`` still completes, with a report that says
    it is not signed. The other stages never read the key: the session's shipped repro ran them."""
    proj = copy_project(_shipped[0], tmp_path / "proj")
    shutil.rmtree(proj.root / ".marin" / "keys")
    shutil.rmtree(proj.root / "reports")
    repro = proj.dvc("repro")
    assert "Running stage 'report'" in repro.stdout and "Running stage 'train'" not in repro.stdout
    assert "NOT SIGNED" in repro.stdout
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    lock = yaml.safe_load((proj.root / "dvc.lock").read_text())
    run = report_runs(proj)[-1]
    out = next(r["body"] for r in run if r["kind"] == "output" and r["body"]["name"] == "report")
    assert lock["stages"]["report"]["outs"][0]["md5"] == out["dvc_md5"]
    r = proj.marin("report", "verify", lock["stages"]["report"]["outs"][0]["path"])
    assert r.returncode == 0 and "not signed" in r.stdout, r.stdout + r.stderr
