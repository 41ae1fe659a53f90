"""Independent verification that a commit cannot fake (issue 38, defect 1): a VSA counts only when
it is exactly the summary of a verification record in the ledger, verified between the run's end
and the report's build, one per record, by a key the lab vouches for in verifications/verifiers.json
(the lab's own report key counted apart, as the lab's); a reader recounts with their own list
(``marin report verify --trust``). The forgeries of the audit are built here with nothing but the
``cryptography`` package, as an outsider would: 20 sybil keys, the lab key unmarked, a record that does
not exist, PASSED over a mismatch, dates in 2099 and 2001, an invented CPU. None is counted."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.conftest import Project
from tests.test_verify import records, rewrite_chain, run_file, run_id, verifications

pytestmark = pytest.mark.slow


def _raw_kid(public) -> str:
    return hashlib.sha256(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()


def _kid(pub_path: Path) -> str:
    return _raw_kid(serialization.load_pem_public_key(pub_path.read_bytes()))


def _canonical(stmt: dict) -> bytes:
    import rfc8785

    return rfc8785.dumps(stmt)


def _dsse(stmt: dict, key: Ed25519PrivateKey) -> dict:
    """A DSSE envelope signed here (PAE by hand), as a forger with only `cryptography` would."""
    body, ptype = _canonical(stmt), b"application/vnd.in-toto+json"
    pae = b"DSSEv1 %d %b %d %b" % (len(ptype), ptype, len(body), body)
    return {"payloadType": ptype.decode(), "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": _raw_kid(key.public_key()), "sig": base64.b64encode(key.sign(pae)).decode()}]}


def _file(proj: Project, run: str, stmt: dict, key: Ed25519PrivateKey) -> str:
    """Commit ``stmt`` signed by ``key`` under verifications/<run>/, its public key beside it."""
    kid = _raw_kid(key.public_key())
    v = proj.root / "verifications"
    (v / "keys").mkdir(parents=True, exist_ok=True)
    (v / "keys" / f"{kid}.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (v / run).mkdir(exist_ok=True)
    (v / run / f"{kid}.intoto.json").write_text(json.dumps(_dsse(stmt, key)))
    return f"verifications/{run}/{kid}.intoto.json"


def _statement(path: Path) -> dict:
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def _as(stmt: dict, key: Ed25519PrivateKey, **marin: object) -> dict:
    """``stmt`` re-addressed to ``key`` (its verifier key id), with some marin fields changed."""
    s = copy.deepcopy(stmt)
    s["predicate"]["marin"]["verifier"]["keyid"] = _raw_kid(key.public_key())
    s["predicate"]["marin"].update(marin)
    return s


def _time(stmt: dict, when: str) -> dict:
    stmt["predicate"]["timeVerified"] = when
    stmt["predicate"]["marin"]["verification_record"]["time"] = when
    return stmt


def _cpu(stmt: dict, model: str) -> dict:
    stmt["predicate"]["marin"]["verifier"]["cpu_model"] = model
    return stmt


def _section(md: str) -> str:
    return md[md.index("## Independent verification"):md.index("## Lineage")]


def _verifiers(proj: Project, entries: list[dict]) -> None:
    (proj.root / "verifications" / "verifiers.json").write_text(
        json.dumps({"schema": "marin.verifiers@1", "verifiers": entries}, indent=1))


def test_verify_sign_refuses_the_lab_key_unless_as_lab(trained_project: Project) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    path = run_file(proj, "fetch")
    rid = run_id(path)
    r = proj.marin("verify", rid, "--sign")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "--as-lab" in lines[0] and "lab's report signing key" in lines[0]
    r = proj.marin("verify", rid, "--sign", "--key", str(proj.root / ".marin/keys/report.key"))
    assert r.returncode != 0 and "--as-lab" in r.stderr  # the same key named explicitly
    assert not (proj.root / "verifications").exists()
    assert [v["result"] for v in verifications(path)] == ["bit-exact", "bit-exact"]  # recorded, unsigned
    r = proj.marin("verify", rid, "--sign", "--as-lab")
    assert r.returncode == 0, r.stderr
    kid = _kid(proj.root / ".marin/keys/report.key.pub")
    assert (proj.root / "verifications" / rid / f"{kid}.intoto.json").is_file()
    assert proj.marin("ledger", "check").returncode == 0


def _vouched(n: int) -> list[Ed25519PrivateKey]:
    return [Ed25519PrivateKey.generate() for _ in range(n)]


def _entry(key: Ed25519PrivateKey, name: str) -> dict:
    return {"keyid": _raw_kid(key.public_key()), "name": name, "contact": f"{name}@example.org",
            "published": f"https://example.org/{name}.pub", "role": "third-party"}


def test_forged_verifications_are_not_counted_and_a_reader_recounts(trained_project: Project,
                                                                     tmp_path: Path) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    lab_kid = _kid(proj.root / ".marin/keys/report.key.pub")
    for name in ("tp", "sybil"):
        proj.marin("keygen", str(tmp_path / f"{name}.key"), check=True)
    tp_kid = _kid(tmp_path / "tp.key.pub")
    fetch, curate = run_id(run_file(proj, "fetch")), run_id(run_file(proj, "curate"))
    # the real ones: a third party's replay of fetch, the lab's own of curate, and an unlisted key's of curate
    assert proj.marin("verify", fetch, "--sign", "--key", str(tmp_path / "tp.key")).returncode == 0
    assert proj.marin("verify", curate, "--sign", "--as-lab").returncode == 0
    assert proj.marin("verify", curate, "--sign", "--key", str(tmp_path / "sybil.key")).returncode == 0
    sybil_path = f"verifications/{curate}/{_kid(tmp_path / 'sybil.key.pub')}.intoto.json"
    real = _statement(proj.root / "verifications" / fetch / f"{tp_kid}.intoto.json")
    lab_own = _statement(proj.root / "verifications" / curate / f"{lab_kid}.intoto.json")
    expect = {sybil_path: ("unvouched", "not in verifications/verifiers.json")}
    sybils = _vouched(20)  # 20 fresh keys, each re-signing the third party's real record as its own
    expect.update({_file(proj, fetch, _as(real, k), k): ("unbacked", f"names key {tp_kid} as its signer")
                   for k in sybils})
    k = _vouched(1)[0]  # a key the lab vouches for claims the lab's own replay: the record names its signer
    expect[_file(proj, curate, _as(lab_own, k), k)] = ("unbacked", f"names key {lab_kid} as its signer")
    _verifiers(proj, [{"keyid": tp_kid, "name": "Example University NLP", "contact": "verify@example.org",
                       "published": "https://example.org/keys/tp.pub", "role": "third-party"}, _entry(k, "v0")])
    proj.marin("report", check=True)
    out = proj.root / "reports" / "marin-tiny"
    doc = json.loads((out / "report.json").read_text())["doc"]["independent_verification"]
    got = {r["file"]: (r["status"], r["why"]) for r in doc["not_counted"]}
    assert set(got) == set(expect), set(got) ^ set(expect)
    for path, (status, why) in expect.items():
        assert got[path][0] == status and why in got[path][1], (path, got[path])
    sec = _section((out / "report.md").read_text())
    assert ("**1 third-party verification(s) by 1 verifier(s) the lab vouches for**, 1 passed; "
            f"1 by the lab itself (not independent), 1 passed; {len(expect)} file(s) not counted.") in sec, sec[:3000]
    assert "| Example University NLP | third-party | verify@example.org | https://example.org/keys/tp.pub |" in sec
    assert f"| fetch | `{fetch}` | Example University NLP | third-party |" in sec
    assert f"| curate | `{curate}` | the lab (report signing key) | lab |" in sec
    assert "sybils" in sec and "clock" in sec  # what a VSA cannot prove, and the time source, said where the count is
    ok = proj.marin("report", "verify", str(out))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # a reader's own list: the unlisted key and the lab key; the lab key is never independent
    reader = tmp_path / "mine.json"
    reader.write_text(json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": _kid(tmp_path / "sybil.key.pub"), "name": "a friend"}, {"keyid": lab_kid}]}))
    r = proj.marin("report", "verify", str(out), "--trust", str(reader))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("trust ") and "1 verification(s) by 1 key(s) you trust (a friend), 1 passed" in line, line
    reader.write_text(json.dumps({"schema": "marin.verifiers@1", "verifiers": []}))
    line = proj.marin("report", "verify", str(out), "--trust", str(reader)).stdout.strip().splitlines()[-1]
    assert "0 verification(s) by 0 key(s) you trust" in line, line
    reader.write_text("{not json")
    r = proj.marin("report", "verify", str(out), "--trust", str(reader))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "mine.json" in r.stderr, r.stderr
    assert proj.marin("ledger", "check").returncode == 0


def test_an_unsigned_report_vouches_for_no_verifier(trained_project: Project, tmp_path: Path) -> None:
    proj = trained_project
    proj.marin("keygen", str(tmp_path / "tp.key"), check=True)
    tp_kid = _kid(tmp_path / "tp.key.pub")
    fetch = run_id(run_file(proj, "fetch"))
    assert proj.marin("verify", fetch, "--sign", "--key", str(tmp_path / "tp.key")).returncode == 0
    _verifiers(proj, [{"keyid": tp_kid, "name": "Example University NLP", "contact": "verify@example.org",
                       "published": "https://example.org/keys/tp.pub", "role": "third-party"}])
    proj.marin("report", check=True)  # no report key: unsigned
    out = proj.root / "reports" / "marin-tiny"
    sec = _section((out / "report.md").read_text())
    assert "**0 third-party verification(s) by 0 verifier(s) the lab vouches for**" in sec, sec[:2000]
    assert "| unvouched | the report is not signed" in sec
    assert proj.marin("report", "verify", str(out)).returncode == 0


def test_each_forgery_of_a_record_is_named_and_counts_only_in_its_window(trained_project: Project,
                                                                         tmp_path: Path) -> None:
    from marin.attest import vsa
    from marin.attest.models import Statement, Vsa
    from marin.ledger.store import load_run

    def backing_problem(stmt: dict | Statement, log, kid: str, as_of: str) -> str | None:  # over the typed VSA
        typed = stmt if isinstance(stmt, Statement) else Statement.from_json(stmt)
        return vsa.backing_problem(Vsa.from_statement(typed), log, kid, as_of)

    proj = trained_project
    proj.marin("keygen", str(tmp_path / "tp.key"), check=True)
    fetch = run_id(run_file(proj, "fetch"))
    assert proj.marin("verify", fetch, "--sign", "--key", str(tmp_path / "tp.key")).returncode == 0
    kid = _kid(tmp_path / "tp.key.pub")
    tp = serialization.load_pem_private_key((tmp_path / "tp.key").read_bytes(), None)
    stmt = _statement(proj.root / "verifications" / fetch / f"{kid}.intoto.json")
    log = load_run(proj.root, fetch)
    rec = [x for x in records(run_file(proj, "fetch")) if x["kind"] == "verification"][-1]
    assert rec["body"]["signer"] == {"keyid": kid}  # written by `verify --sign`, before signing
    assert backing_problem(stmt, log, kid, rec["time"]) is None  # at the very build time: counted
    why = backing_problem(stmt, log, kid, log.finished.time)  # a report built before the replay
    assert why is not None and "after the report was built" in why
    ref = stmt["predicate"]["marin"]["verification_record"]
    forged = {  # each by the record's own signer, so that only the forged field can be what is named
        "has no verification record there": _as(stmt, tp, verification_record={**ref, "seq": 999}),
        "/predicate/marin/exit_code": _as(stmt, tp, result="mismatch", exit_code=1),  # PASSED over a mismatch
        'time is "2099': _time(_as(stmt, tp), "2099-01-01T00:00:00.000000Z"),
        'time is "2001': _time(_as(stmt, tp), "2001-01-01T00:00:00.000000Z"),
        "/predicate/marin/verifier/cpu_model": _cpu(_as(stmt, tp), "AMD EPYC 9654 96-Core (independent lab)"),
    }
    for words, bad in forged.items():
        why = backing_problem(bad, log, kid, "2100-01-01T00:00:00Z")
        assert why is not None and words in why, (words, why)
    # a record of a skipped replay (compared nothing), chained and signed as marin would: no verdict (issue 55, 5)
    path = run_file(proj, "fetch")
    recs = records(path)
    recs[-1]["body"]["compared"] = {}
    rewrite_chain(path, recs)
    assert proj.marin("ledger", "check").returncode == 0
    log = load_run(proj.root, fetch)
    empty = vsa.summary("fetch", log.records[-1], kid)
    why = backing_problem(empty, log, kid, "2100-01-01T00:00:00Z")
    assert why is not None and "compared no record" in why, why


@pytest.mark.parametrize(("doc", "words"), [
    (b"{", "not JSON"),
    (json.dumps({"schema": "other", "verifiers": []}).encode(), "not a verifiers list"),
    (json.dumps({"schema": "marin.verifiers@1", "verifiers": [{"keyid": "ab"}]}).encode(), "not a key id"),
    (json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": "a" * 64, "name": "x", "contact": "c", "published": "p", "role": "friend"}]}).encode(), "role"),
    (json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": "a" * 64, "name": " ", "contact": "c", "published": "p", "role": "lab"}]}).encode(), "name"),
    (json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": "a" * 64, "name": "x", "contact": "c", "published": "p", "role": "lab", "trust": 1}]}).encode(),
     "unknown field"),
    (json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": "a" * 64, "name": "x", "contact": "c", "published": "p", "role": "lab"}] * 2}).encode(),
     "listed twice"),
    (b" " * ((1 << 20) + 1), "cap"),
])
def test_a_bad_verifiers_list_is_one_line_naming_the_entry(doc: bytes, words: str) -> None:
    from marin.attest import verifiers

    with pytest.raises(verifiers.TrustListError) as e:
        verifiers.parse(doc, "verifications/verifiers.json")
    assert words in str(e.value) and str(e.value).startswith("verifications/verifiers.json") \
        and "\n" not in str(e.value)


def test_a_good_verifiers_list_parses_and_a_reader_list_may_leave_out_the_rest() -> None:
    from marin.attest import verifiers

    lab = verifiers.parse(json.dumps({"schema": "marin.verifiers@1", "verifiers": [
        {"keyid": "a" * 64, "name": "Lab  CI", "contact": "c", "published": "p", "role": "lab"}]}).encode(), "f")
    assert lab.role("a" * 64) == "lab" and lab.get("a" * 64).name == "Lab CI" and lab.role("b" * 64) is None
    mine = verifiers.parse(json.dumps({"schema": "marin.verifiers@1", "verifiers": [{"keyid": "b" * 64}]}).encode(),
                           "mine", default_role="third-party")
    assert mine.role("b" * 64) == "third-party"
    with pytest.raises(verifiers.TrustListError):  # the lab's own list names every verifier
        verifiers.parse(json.dumps({"schema": "marin.verifiers@1", "verifiers": [{"keyid": "b" * 64,
                                                                                   "role": "lab"}]}).encode(), "f")
