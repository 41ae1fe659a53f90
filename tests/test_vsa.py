"""Signed verification summaries: ``marin verify --sign`` writes a SLSA VSA that outside
libraries accept (securesystemslib for DSSE, in-toto-attestation for the statement and the VSA
predicate); ``marin report`` counts only valid ones; ``marin report verify`` catches a listed
VSA changed afterwards. The fetch run is the one verified: its replay takes seconds."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from datetime import datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from google.protobuf import json_format
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from tests.conftest import Project
from tests.test_verify import records, run_file, run_id, verifications

pytestmark = pytest.mark.slow
VSA = "https://slsa.dev/verification_summary/v1"


def _kid(pub_path: Path) -> str:
    """The key id, computed here: sha256 of the raw 32 public key bytes."""
    pub = serialization.load_pem_public_key(pub_path.read_bytes())
    return hashlib.sha256(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()


def _statement(envelope: dict) -> dict:
    return json.loads(base64.b64decode(envelope["payload"]))


def _sslib_verify(envelope: dict, pub_path: Path) -> list[str]:
    pub = serialization.load_pem_public_key(pub_path.read_bytes())
    key = SSlibKey.from_crypto(pub, keyid=_kid(pub_path))
    return list(Envelope.from_dict(copy.deepcopy(envelope)).verify([key], 1))


def test_verify_sign_writes_a_vsa_that_outside_libraries_accept(trained_project: Project) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    path = run_file(proj, "fetch")
    rid = run_id(path)
    r = proj.marin("verify", rid, "--sign", "--as-lab")
    assert r.returncode == 0, r.stdout + r.stderr
    pub = proj.root / ".marin/keys/report.key.pub"
    kid = _kid(pub)
    out = proj.root / "verifications" / rid / f"{kid}.intoto.json"
    assert f"verifications/{rid}/{kid}.intoto.json" in r.stdout
    envelope = json.loads(out.read_text())
    assert _sslib_verify(envelope, pub) == [kid]
    # the public key committed beside it, under its own id
    assert (proj.root / "verifications" / "keys" / f"{kid}.pub").read_bytes() == pub.read_bytes()
    stmt = _statement(envelope)
    Statement.copy_from_pb(json_format.ParseDict(stmt, statement_pb2.Statement())).validate()
    predicate = stmt["predicate"]
    # the marin-namespaced extension aside, and verifiedLevels: the spec makes it an array, the v1 proto a
    # string (in-toto/attestation#425), so it is checked by hand
    standard = {k: v for k, v in predicate.items() if k not in ("marin", "verifiedLevels")}
    summary = json_format.ParseDict(standard, vsa_pb2.VerificationSummary(), ignore_unknown_fields=False)
    assert stmt["predicateType"] == VSA and summary.verification_result == "PASSED"
    assert summary.resource_uri == f"marin:run/{rid}" and summary.verifier.id and summary.policy.uri
    assert predicate["verifiedLevels"] == ["MARIN_REPLAY_FULL"]  # a custom level: SLSA_ is reserved
    # against the run file, read here: the subject and the verification record it summarises
    recs = records(path)
    finished = next(x for x in recs if x["kind"] == "run.finished")
    [rec] = [x for x in recs if x["kind"] == "verification"]
    assert recs[-1] == rec  # signed after the record was appended, which stays the last
    assert {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]} == {
        f"marin:run/{rid}#run.finished": finished["digest"].removeprefix("sha256:"),
        f"marin:run/{rid}#recipe": recs[0]["body"]["recipe_digest"].removeprefix("sha256:")}
    assert predicate["timeVerified"] == rec["time"] and datetime.fromisoformat(predicate["timeVerified"]).tzinfo
    assert summary.time_verified.ToJsonString()[:19] == rec["time"][:19]
    m, body = predicate["marin"], rec["body"]
    assert (m["result"], m["mode"], m["exit_code"]) == (body["result"], body["mode"], 0) == ("bit-exact", "full", 0)
    env = body["verifier"]["env"]
    assert m["verifier"]["cpu_model"] == env["cpu_model"]
    assert m["verifier"]["cpu_features"] == env.get("cpu_features", env.get("isa_flags")) != []
    assert m["verifier"]["determinism_class"] == body["verifier"]["determinism_class"]
    assert m["verifier"]["keyid"] == kid
    assert m["verification_record"] == {"seq": rec["seq"], "digest": rec["digest"], "time": rec["time"]}
    # the folder is meant to be committed: git does not ignore it
    assert proj.run("git", "check-ignore", "-q", str(out)).returncode == 1
    assert proj.marin("ledger", "check").returncode == 0


def test_sign_without_a_key_fails_in_one_line_and_keeps_the_verification(trained_project: Project,
                                                                           tmp_path: Path) -> None:
    proj = trained_project
    path = run_file(proj, "fetch")
    r = proj.marin("verify", run_id(path), "--sign")
    assert r.returncode != 0 and "BIT-EXACT" in r.stdout
    [line] = r.stderr.strip().splitlines()
    assert "marin keygen" in line and ".marin/keys/report.key" in line and "recorded" in line
    r = proj.marin("verify", run_id(path), "--sign", "--key", str(tmp_path / "nowhere.key"))
    [line] = r.stderr.strip().splitlines()
    assert r.returncode != 0 and "nowhere.key" in line and "marin keygen" in line
    assert [v["result"] for v in verifications(path)] == ["bit-exact", "bit-exact"]  # both recorded
    assert not (proj.root / "verifications").exists()
    assert proj.marin("ledger", "check").returncode == 0


def _forge(proj: Project, tmp_path: Path, runs: dict[str, str], a_env: dict, kid_a: str) -> dict[str, str]:
    """VSAs that must not count, filed under runs of the report: {file: expected status}."""
    from marin.attest import dsse, keyring

    key_a = proj.root / ".marin/keys/report.key"
    v = proj.root / "verifications"
    out = {}

    def sign(stmt: dict, key: Path) -> dict:  # marin signs a typed statement; the file holds its JSON
        return dsse.sign(dsse.Statement.from_json(stmt), key).to_json()

    def put(run: str, kid: str, envelope: dict, status: str) -> None:
        (v / run).mkdir(exist_ok=True)
        (v / run / f"{kid}.intoto.json").write_text(json.dumps(envelope))
        out[f"verifications/{run}/{kid}.intoto.json"] = status

    stmt = _statement(a_env)
    changed = copy.deepcopy(stmt)  # 1. the payload changed (FAILED -> PASSED style edits), signature kept
    changed["predicate"]["marin"]["result"] = "bit-exact "
    put(runs["curate"], kid_a, {**a_env, "payload": base64.b64encode(json.dumps(changed).encode()).decode()},
        "invalid")
    other = copy.deepcopy(stmt)  # 2. signed, but its predicate is not a verification summary
    other["predicateType"] = "https://slsa.dev/provenance/v1"
    put(runs["train"], kid_a, sign(other, key_a), "invalid")
    put(runs["tokenize"], kid_a, a_env, "invalid")  # 3. a valid VSA about fetch, filed under another run
    put(runs["evaluate"], "b" * 64, {**a_env, "signatures": []}, "unsigned")  # 4. no signature
    c_key, c_pub = keyring.keygen(tmp_path / "c.key")  # 5. signed with a key nobody committed
    put(runs["curate"], _kid(c_pub), sign(stmt, c_key), "unverifiable")
    d_key, d_pub = keyring.keygen(tmp_path / "d.key")  # 6. a key committed under another key's id
    (v / "keys" / f"{'d' * 64}.pub").write_bytes(d_pub.read_bytes())
    put(runs["train"], "d" * 64, sign(stmt, d_key), "invalid")
    ev = copy.deepcopy(stmt)  # 7. about evaluate, signed, but not the version of the run in the ledger
    ev["predicate"]["marin"]["run_id"] = runs["evaluate"]
    ev["subject"] = [{"name": f"marin:run/{runs['evaluate']}#{n}", "digest": {"sha256": "0" * 64}}
                     for n in ("run.finished", "recipe")]
    put(runs["evaluate"], kid_a, sign(ev, key_a), "invalid")
    return out


def _fact_value(root: Path, src: dict) -> object:
    """A VSA fact's source read here: the file's sha256, its payload decoded, the JSON pointer."""
    data = (root / src["vsa"]).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == src["file_digest"]
    doc = _statement(json.loads(data))
    for part in src["pointer"].split("/")[1:]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def test_the_report_counts_two_verifiers_and_lists_invalid_ones(trained_project: Project, tmp_path: Path) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    proj.marin("keygen", str(tmp_path / "b.key"), check=True)
    kid_a, kid_b = _kid(proj.root / ".marin/keys/report.key.pub"), _kid(tmp_path / "b.key.pub")
    runs = {s: run_id(run_file(proj, s)) for s in ("fetch", "curate", "tokenize", "train", "evaluate")}
    fetch = runs["fetch"]
    assert proj.marin("verify", fetch, "--sign", "--as-lab").returncode == 0
    assert proj.marin("verify", fetch, "--sign", "--key", str(tmp_path / "b.key")).returncode == 0
    listed = {"keyid": kid_b, "name": "B lab", "contact": "b@example.org", "published": "https://example.org/b.pub",
              "role": "third-party"}
    (proj.root / "verifications" / "verifiers.json").write_text(
        json.dumps({"schema": "marin.verifiers@1", "verifiers": [listed]}))
    a_path = proj.root / "verifications" / fetch / f"{kid_a}.intoto.json"
    forged = _forge(proj, tmp_path, runs, json.loads(a_path.read_text()), kid_a)
    proj.marin("report", check=True)
    out = proj.root / "reports" / "marin-tiny"
    ok = proj.marin("report", "verify", str(out))
    assert ok.returncode == 0 and "2 counted verifications re-checked, " in ok.stdout, ok.stdout + ok.stderr

    report = json.loads((out / "report.json").read_text())
    sec, facts = report["doc"]["independent_verification"], report["facts"]
    assert {facts[r["keyid"]]["value"] for r in sec["counted"]} == {kid_a, kid_b}
    assert sec["verifiers"] == [kid_b] and {r["role"] for r in sec["counted"]} == {"lab", "third-party"}
    assert {r["file"]: r["status"] for r in sec["not_counted"]} == forged
    for r in sec["counted"]:  # each counted VSA verifies with securesystemslib and the committed key
        env = json.loads((proj.root / r["file"]).read_text())
        kid = Path(r["file"]).name.removesuffix(".intoto.json")
        assert _sslib_verify(env, proj.root / "verifications" / "keys" / f"{kid}.pub") == [kid]
    vsa_facts = {fid: f for fid, f in facts.items() if "vsa" in f["source"]}
    assert len(vsa_facts) == 2 * 8
    for f in vsa_facts.values():
        assert _fact_value(proj.root, f["source"]) == f["value"]
    md = (out / "report.md").read_text()
    section = md[md.index("## Independent verification"):md.index("## Lineage")]
    assert ("**1 third-party verification(s) by 1 verifier(s) the lab vouches for**, 1 passed; 1 by the lab itself "
            "(not independent), 1 passed; 7 file(s) not counted.") in section
    for file, status in forged.items():
        assert f"| `{file}` | {status} |" in section
    assert "signature does not verify" in section and "unknown predicate type" in section
    assert f"its subject is run {fetch}, but it is filed under {runs['tokenize']}" in section
    assert "public key not found" in section and f"{'d' * 64}.pub holds another key ({_kid(tmp_path / 'd.key.pub')})" \
        in section and "another version of the run" in section
    # every file under verifications/ is an input of the report run, by digest
    [report_run] = [p for p in (proj.root / "ledger" / "runs").glob("report-*.jsonl")]
    inputs = {x["body"]["path"]: x["body"]["digest"] for x in records(report_run) if x["kind"] == "input"}
    for p in (proj.root / "verifications").rglob("*"):
        if p.is_file():
            rel = p.relative_to(proj.root).as_posix()
            assert inputs[rel] == "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest(), rel

    # a listed VSA changed afterwards (still validly signed: the same envelope, re-indented)
    b_path = proj.root / "verifications" / fetch / f"{kid_b}.intoto.json"
    pristine = b_path.read_bytes()
    b_path.write_text(json.dumps(json.loads(pristine)))
    r = proj.marin("report", "verify", str(out))
    assert r.returncode == 1 and f"verifications/{fetch}/{kid_b}.intoto.json: changed since the report read it" \
        in r.stderr, r.stderr
    b_path.write_bytes(pristine)
    assert proj.marin("report", "verify", str(out)).returncode == 0
    (proj.root / "verifications" / "keys" / f"{kid_b}.pub").unlink()  # the key it was checked with, gone
    r = proj.marin("report", "verify", str(out))
    assert r.returncode == 1 and f"verifications/keys/{kid_b}.pub: listed by the report" in r.stderr, r.stderr
