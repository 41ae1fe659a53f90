"""The trust policy's pieces alone (marin.attest.policy, marin.attest.models): each check on a table of
claims, their composition, and the typed models' one-line refusals. Runs are built in memory from
schema-valid records (Record.create) and VSAs signed with throwaway keys: no project, no stage."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from marin.attest import dsse, keyring, policy, verifiers, vsa
from marin.attest.models import AttestationError, Envelope, Statement, Vsa
from marin.attest.policy import Claim, Verdict
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from tests.test_records import EXAMPLES

RUN, OTHER = "fetch-20260101T000000Z-0123abcd", "curate-20260101T000000Z-4567abcd"
AS_OF = "2026-01-02T00:00:00.000000Z"


@dataclass(frozen=True)
class World:
    """Two runs, the verifier's and the lab's keys, and the verifier's VSA of the first run."""

    runs: dict[str, RunLog]
    key: Path  # the verifier's private key
    kid: str
    lab_kid: str
    pub: bytes  # the verifier's public key (PEM)
    stmt: dict[str, Any]  # the VSA's statement marin builds, as JSON


def _log(run_id: str, stage: str, signer: str | None) -> RunLog:
    out: list[Record] = []

    def add(kind: str, body: dict[str, Any]) -> Record:
        out.append(Record.create(run_id, len(out), out[-1].digest if out else None, kind, body,
                                 time=f"2026-01-01T00:00:{len(out):02d}.000000Z"))
        return out[-1]

    started = add("run.started", {**copy.deepcopy(EXAMPLES["run.started"]), "stage": stage})
    finished = add("run.finished", copy.deepcopy(EXAMPLES["run.finished"]))
    body = {**copy.deepcopy(EXAMPLES["verification"]), "mode": "full", "result": "bit-exact", "exit_code": 0,
            "first_divergence": None, "verified": {"run_id": run_id, "recipe_digest": started.body["recipe_digest"],
                                                   "finished_digest": finished.digest}}
    del body["segments"]
    add("verification", body | ({"signer": {"keyid": signer}} if signer else {}))
    return RunLog(Path(f"{run_id}.jsonl"), out)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("keys")
    key, pub = keyring.keygen(tmp / "verifier.key")
    lab, _ = keyring.keygen(tmp / "lab.key")
    kid = keyring.keyid(keyring.load_private_key(key))
    runs = {RUN: _log(RUN, "fetch", kid), OTHER: _log(OTHER, "curate", kid)}
    stmt = vsa.summary("fetch", runs[RUN].records[-1], kid).doc
    return World(runs, key, kid, keyring.keyid(keyring.load_private_key(lab)), pub.read_bytes(), stmt)


def _signed(w: World, stmt: dict[str, Any]) -> bytes:
    return json.dumps(dsse.sign(Statement.from_json(stmt), w.key).to_json()).encode()


def _edited(w: World, edit: Callable[[dict[str, Any]], None]) -> bytes:
    stmt = copy.deepcopy(w.stmt)
    edit(stmt)
    return _signed(w, stmt)


def _flipped(w: World) -> dict[str, bytes]:
    """The VSA with one payload byte flipped after signing."""
    env = json.loads(_signed(w, w.stmt))
    body = bytearray(base64.b64decode(env["payload"]))
    body[len(body) // 2] ^= 0x01
    return _files(w, json.dumps(env | {"payload": base64.b64encode(bytes(body)).decode()}).encode())


def _files(w: World, data: bytes, run: str = RUN, kid: str | None = None, key_file: bool = True) -> dict[str, bytes]:
    """The VSA filed under ``run`` and key id ``kid`` (the verifier's), and the verifier's public key filed
    under that key id beside it (unless not ``key_file``)."""
    kid = kid or w.kid
    files = {f"verifications/{run}/{kid}.intoto.json": data}
    return files | ({f"verifications/keys/{kid}.pub": w.pub} if key_file else {})


def _claim(files: dict[str, bytes], runs: dict[str, RunLog]) -> Claim:
    [claim] = policy.claims(files, runs)
    return claim


def _set(ptr: str, value: object) -> Callable[[dict[str, Any]], None]:
    *path, last = ptr.split("/")[1:]

    def edit(doc: Any) -> None:
        for part in path:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        if value is None:
            del doc[last]
        else:
            doc[last] = value

    return edit


# -- signed: each way a file fails to open, and the one that opens ---------------------------------------------

SIGNED: list[tuple[str, Callable[[World], dict[str, bytes]], str, str]] = [
    # (name, the files, status, words of why)
    ("valid", lambda w: _files(w, _signed(w, w.stmt)), "valid", ""),
    ("not JSON", lambda w: _files(w, b"{"), "invalid", "not JSON (JSONDecodeError)"),
    ("no signatures", lambda w: _files(w, json.dumps(json.loads(_signed(w, w.stmt)) | {"signatures": []}).encode()),
     "unsigned", "nobody vouches"),
    ("not a key id", lambda w: _files(w, _signed(w, w.stmt), kid="nobody"), "invalid", "not a key id"),
    ("no key file", lambda w: _files(w, _signed(w, w.stmt), key_file=False), "unverifiable", "public key not found"),
    ("another key's file", lambda w: _files(w, _signed(w, w.stmt), kid="d" * 64), "invalid", "holds another key"),
    ("payload changed", _flipped, "invalid", "signature does not verify"),
    ("bad envelope", lambda w: _files(w, json.dumps({"signatures": [1]}).encode()), "invalid",
     "not a DSSE envelope"),
    ("other predicate", lambda w: _files(w, _edited(w, _set("/predicateType", dsse.PROVENANCE_TYPE))), "invalid",
     "unknown predicate type"),
    ("no marin fields", lambda w: _files(w, _edited(w, _set("/predicate/marin/mode", None))), "invalid",
     "not a marin verification summary"),
    ("filed under another run", lambda w: _files(w, _signed(w, w.stmt), run=OTHER), "invalid",
     f"its subject is run {RUN}, but it is filed under {OTHER}"),
    ("another version", lambda w: _files(w, _edited(w, _set("/subject/0/digest/sha256", "0" * 64))), "invalid",
     "another version of the run"),
    ("another verifier", lambda w: _files(w, _edited(w, _set("/predicate/marin/verifier/keyid", "e" * 64))),
     "invalid", "names verifier key eeee"),
    ("a cited value missing", lambda w: _files(w, _edited(w, _set("/predicate/marin/verifier/cpu_model", None))),
     "invalid", "nothing at /predicate/marin/verifier/cpu_model"),
]


@pytest.mark.parametrize(("name", "files", "status", "words"), SIGNED, ids=[t[0] for t in SIGNED])
def test_signed_gives_each_failure_its_status(world: World, name: str, files: Callable[[World], dict[str, bytes]],
                                               status: str, words: str) -> None:
    v = policy.signed(_claim(files(world), world.runs))
    assert v.status == status and words in v.why and "\n" not in v.why, v


# -- backed, vouched, trusted_by: each on its own ----------------------------------------------------------------

BACKED: list[tuple[str, Callable[[dict[str, Any]], None] | None, str, str, str]] = [
    # (name, an edit of the statement before signing, as of, status, words of why)
    ("backed", None, AS_OF, "valid", ""),
    ("verified after the build", None, "2026-01-01T00:00:01.000000Z", "unbacked", "after the report was built"),
    ("no such record", _set("/predicate/marin/verification_record/seq", 999), AS_OF, "unbacked",
     "has no verification record there"),
    ("another record digest", _set("/predicate/marin/verification_record/digest", "sha256:" + "0" * 64), AS_OF,
     "unbacked", "the ledger's is"),
    ("PASSED over a mismatch", _set("/predicate/marin/result", "mismatch"), AS_OF, "unbacked",
     "/predicate/marin/result"),
    ("an invented CPU", _set("/predicate/marin/verifier/cpu_model", "EPYC"), AS_OF, "unbacked",
     "/predicate/marin/verifier/cpu_model"),
]


@pytest.mark.parametrize(("name", "edit", "as_of", "status", "words"), BACKED, ids=[t[0] for t in BACKED])
def test_backed_holds_a_vsa_to_its_record(world: World, name: str, edit: Callable[[dict[str, Any]], None] | None,
                                          as_of: str, status: str, words: str) -> None:
    claim = _claim(_files(world, _edited(world, edit or (lambda _: None))), world.runs)
    assert policy.signed(claim).ok
    v = policy.backed(as_of)(claim)
    assert v.status == status and words in v.why, v


def test_backed_refuses_a_record_made_without_the_key(world: World) -> None:
    runs = {RUN: _log(RUN, "fetch", None)}  # the record names no signer: not `marin verify --sign`
    stmt = vsa.summary("fetch", runs[RUN].records[-1], world.kid).doc
    v = policy.backed(AS_OF)(_claim(_files(world, _signed(world, stmt)), runs))
    assert v.status == "unbacked" and "names no signer" in v.why, v


def _trust(*entries: tuple[str, str]) -> verifiers.TrustList:
    return verifiers.TrustList("mine.json", {k: verifiers.ListedVerifier(k, "n", "c", "p", role)
                                             for k, role in entries})


VOUCHED: list[tuple[str, bool, bool, tuple[tuple[str, str], ...], str | None, str, str]] = [
    # (name, the verifier's key is the lab's, the report is signed, the lab's list, role, status, words)
    ("the lab's own key", True, True, (), "lab", "valid", ""),
    ("listed third party", False, True, (("kid", "third-party"),), "third-party", "valid", ""),
    ("listed as the lab's", False, True, (("kid", "lab"),), "lab", "valid", ""),
    ("not listed", False, True, (), None, "unvouched", "is not in verifications/verifiers.json"),
    ("unsigned report", False, False, (("kid", "third-party"),), None, "unvouched", "the report is not signed"),
]


@pytest.mark.parametrize(("name", "is_lab", "signed", "listed", "role", "status", "words"), VOUCHED,
                         ids=[t[0] for t in VOUCHED])
def test_vouched_counts_only_keys_the_lab_answers_for(world: World, name: str, is_lab: bool, signed: bool,
                                                      listed: tuple[tuple[str, str], ...], role: str | None,
                                                      status: str, words: str) -> None:
    claim = _claim(_files(world, _signed(world, world.stmt)), world.runs)
    lab_key = (world.kid if is_lab else world.lab_kid) if signed else None
    trust = _trust(*((world.kid, r) for _, r in listed))
    v = policy.vouched(lab_key, trust)(claim)
    assert (policy.role(claim.keyid, lab_key, trust), v.status) == (role, status) and words in v.why, v


@pytest.mark.parametrize(("listed", "lab", "ok"), [(True, False, True), (False, False, False), (True, True, False)],
                         ids=["listed", "not listed", "the lab's key, listed"])
def test_trusted_by_a_reader_never_counts_the_lab_key(world: World, listed: bool, lab: bool, ok: bool) -> None:
    claim = _claim(_files(world, _signed(world, world.stmt)), world.runs)
    trust = _trust((world.kid, "third-party")) if listed else _trust()
    assert policy.trusted_by(trust, world.kid if lab else world.lab_kid)(claim).ok is ok


# -- the composition -----------------------------------------------------------------------------------------------


def _fixed(status: str) -> policy.Check:
    return lambda claim: Verdict(status, status)


@pytest.mark.parametrize(("statuses", "want"), [
    ((), "valid"), (("valid", "valid"), "valid"), (("unbacked", "unvouched"), "unbacked"),
    (("valid", "unvouched", "invalid"), "unvouched"),
])
def test_all_of_is_the_first_verdict_that_is_not_valid(world: World, statuses: tuple[str, ...], want: str) -> None:
    claim = _claim(_files(world, _signed(world, world.stmt)), world.runs)
    assert policy.all_of(*map(_fixed, statuses))(claim).status == want


COMPOSED: list[tuple[str, Callable[[World], dict[str, bytes]], str, str]] = [
    # (name, files, as of, the lab policy's status): the earliest check that fails names it
    ("counted", lambda w: _files(w, _signed(w, w.stmt)), AS_OF, "valid"),
    ("unsigned before anything else", lambda w: _files(w, json.dumps(
        json.loads(_signed(w, w.stmt)) | {"signatures": []}).encode()), "2000-01-01T00:00:00Z", "unsigned"),
    ("unbacked before unvouched", lambda w: _files(w, _signed(w, w.stmt)), "2000-01-01T00:00:00Z", "unbacked"),
]


@pytest.mark.parametrize(("name", "files", "as_of", "status"), COMPOSED, ids=[t[0] for t in COMPOSED])
def test_the_lab_policy_is_signed_then_backed_then_vouched(world: World, name: str,
                                                           files: Callable[[World], dict[str, bytes]], as_of: str,
                                                           status: str) -> None:
    lab_key = world.kid if status == "valid" else world.lab_kid  # unbacked would otherwise also be unvouched
    [j] = policy.judge(files(world), world.runs, lab_key, _trust(), as_of)
    assert j.verdict.status == status and j.path.startswith("verifications/"), j.verdict


def test_judge_reads_only_vsas_filed_under_the_runs_and_recount_uses_the_readers_list(world: World) -> None:
    data = _signed(world, world.stmt)
    files = _files(world, data) | {f"verifications/someone-else/{world.kid}.intoto.json": data,
                                   "verifications/verifiers.json": b"{}", f"verifications/keys/{'f' * 64}.pub": b""}
    [claim] = policy.claims(files, world.runs)
    assert claim.path == f"verifications/{RUN}/{world.kid}.intoto.json" and claim.vsa is not None
    mine = _trust((world.kid, "third-party"))
    assert policy.recount([claim], mine, world.lab_kid, AS_OF) == policy.Recount(1, 1, 1, ["n"], 0)
    assert policy.recount([claim], mine, world.kid, AS_OF) == policy.Recount(0, 0, 0, [], 1)  # the lab's own
    assert policy.recount([claim], mine, world.lab_kid, "2000-01-01T00:00:00Z") == policy.Recount(0, 0, 0, [], 0)


# -- the typed models: parsed once, one line for each bad shape ----------------------------------------------------

GOOD = {"payloadType": dsse.PAYLOAD_TYPE, "payload": base64.b64encode(b"{}").decode(), "signatures": []}
ENVELOPES: list[tuple[bytes, str]] = [
    (b"[", "not JSON"),
    (b"[]", "needs payloadType, payload and signatures"),
    (json.dumps(GOOD | {"payload": 5}).encode(), "payload is not a base64 string"),
    (json.dumps(GOOD | {"payload": "***"}).encode(), "payload is not valid base64"),
    (json.dumps(GOOD | {"signatures": {}}).encode(), "signatures is not a list"),
    (json.dumps(GOOD | {"payloadType": "text/plain"}).encode(), "payloadType is 'text/plain'"),
    (json.dumps(GOOD | {"signatures": ["sig"]}).encode(), "signatures[0] is not an object"),
]


@pytest.mark.parametrize(("data", "words"), ENVELOPES, ids=[w for _, w in ENVELOPES])
def test_a_bad_envelope_is_one_line(data: bytes, words: str) -> None:
    with pytest.raises(AttestationError) as e:
        Envelope.parse(data)
    assert words in str(e.value) and "\n" not in str(e.value)


STATEMENT = {"_type": dsse.STATEMENT_TYPE, "subject": [{"name": "a", "digest": {"sha256": "ab"}}],
             "predicateType": "t", "predicate": {}}
STATEMENTS: list[tuple[object, str]] = [
    ([], "not an in-toto Statement v1 (_type"),
    (STATEMENT | {"_type": "https://in-toto.io/Statement/v0.1"}, "not an in-toto Statement v1 (_type"),
    (STATEMENT | {"subject": {}}, "needs a subject list"),
    (STATEMENT | {"predicateType": 1}, "a predicateType string"),
    (STATEMENT | {"predicate": []}, "a predicate object"),
    (STATEMENT | {"subject": [{"name": "a"}]}, "subject[0] is not a name with a digest"),
    (STATEMENT | {"subject": [{"name": "a", "digest": {"sha256": 1}}]}, "subject[0] is not a name with a digest"),
]


@pytest.mark.parametrize(("value", "words"), STATEMENTS, ids=[f"{i}-{w}" for i, (_, w) in enumerate(STATEMENTS)])
def test_a_bad_statement_is_one_line(value: object, words: str) -> None:
    with pytest.raises(AttestationError) as e:
        Statement.from_json(value)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_models_round_trip_and_read_a_vsa(world: World) -> None:
    env = Envelope.parse(_signed(world, world.stmt))
    assert Envelope.from_json(json.loads(json.dumps(env.to_json()))) == env and env.signed
    stmt = dsse.statement_of(env)
    assert stmt == Statement.from_json(world.stmt) and stmt.canonical() == env.payload
    v = Vsa.from_statement(stmt)
    log = world.runs[RUN]
    assert (v.run_id, v.result, v.mode, v.verifier_keyid) == (RUN, vsa.PASSED, "full", world.kid)
    assert (v.record_seq, v.record_digest) == (log.records[-1].seq, log.records[-1].digest)
    assert stmt.digests() == {f"marin:run/{RUN}#run.finished": log.end.digest,
                              f"marin:run/{RUN}#recipe": log.recipe_digest}
    with pytest.raises(AttestationError, match="a malformed verification summary"):
        Vsa.from_statement(Statement.from_json(world.stmt | {"predicate": {
            **world.stmt["predicate"], "marin": {**world.stmt["predicate"]["marin"], "verifier": "me"}}}))
