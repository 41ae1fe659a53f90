"""Signed provenance, checked by outside implementations: securesystemslib (DSSE) and in-toto-attestation (SLSA)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1.provenance_pb2 import Provenance
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from marin.attest import dsse, keyring
from marin.attest.dsse import AttestationError
from marin.attest.keyring import SigningKeyError

DIGEST_A = "sha256:" + "ab" * 32
DIGEST_B = "sha256:" + hashlib.sha256(b"tokens").hexdigest()


def _predicate(**extra: object) -> dict:
    return dsse.slsa_predicate(
        build_type="https://marin.local/buildtypes/stage/v1",
        external_parameters={"stage": "train", "params": {"lr": 0.001, "steps": 20}},
        internal_parameters={"recipe_digest": DIGEST_A},
        resolved_dependencies=[
            dsse.resource(uri="git+https://example.org/marin", git_commit="0" * 40),
            dsse.resource(name="data/tokens", digest=DIGEST_B, annotations={"size": 1234}),
        ],
        builder_id="https://marin.local/builder/local",
        invocation_id="0c9d5a0e-4e3b-4a47-9a43-7c1f7cf6b3a1",
        started_on="2024-05-01T12:00:00Z",
        finished_on="2024-05-01T12:03:07Z",
        **extra,
    )


def _statement() -> dict:
    return dsse.statement([("checkpoints/final", DIGEST_A), ("data/tokens", DIGEST_B)], _predicate()).doc


# marin's envelopes and statements are typed (marin.attest.models); outside tools read their JSON


def _sign(stmt: dict, key: Path) -> dict:
    return dsse.sign(dsse.Statement.from_json(stmt), key).to_json()


def _unsigned(stmt: dict) -> dict:
    return dsse.unsigned(dsse.Statement.from_json(stmt)).to_json()


def _verify(env: dict, pub: Path) -> dict:
    return dsse.verify(dsse.Envelope.from_json(env), pub).doc


def _read_unsigned(env: dict) -> dict:
    return dsse.read_unsigned(dsse.Envelope.from_json(env)).doc


def _is_signed(env: dict) -> bool:
    return dsse.Envelope.from_json(env).signed


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return keyring.keygen(tmp_path / "keys" / "marin.key")


def _sslib_key(public_path: Path) -> SSlibKey:
    pub = serialization.load_pem_public_key(public_path.read_bytes())
    return SSlibKey.from_crypto(pub, keyid=keyring.keyid(pub))


# -- keys -----------------------------------------------------------------------------------


def test_keygen_writes_an_ed25519_pem_pair(tmp_path: Path) -> None:
    priv, pub = keyring.keygen(tmp_path / "k" / "signing.key")
    assert pub == tmp_path / "k" / "signing.key.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    private_key, public_key = keyring.load_private_key(priv), keyring.load_public_key(pub)
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert len(raw) == 32
    assert keyring.keyid(public_key) == keyring.keyid(private_key.public_key()) == hashlib.sha256(raw).hexdigest()


def test_keygen_takes_an_explicit_public_path(tmp_path: Path) -> None:
    priv, pub = keyring.keygen(tmp_path / "a.pem", tmp_path / "elsewhere" / "b.pem")
    assert pub == tmp_path / "elsewhere" / "b.pem"
    assert keyring.keyid(keyring.load_public_key(pub)) == keyring.keyid(keyring.load_private_key(priv).public_key())


def test_keygen_refuses_to_overwrite(tmp_path: Path) -> None:
    priv, pub = keyring.keygen(tmp_path / "marin.key")
    before = priv.read_bytes(), pub.read_bytes()
    with pytest.raises(SigningKeyError, match="already exists; marin never overwrites a key"):
        keyring.keygen(priv)
    assert (priv.read_bytes(), pub.read_bytes()) == before


def test_keygen_refuses_when_only_the_public_file_exists(tmp_path: Path) -> None:
    (tmp_path / "marin.key.pub").write_text("stale")
    with pytest.raises(SigningKeyError, match=r"marin\.key\.pub: already exists"):
        keyring.keygen(tmp_path / "marin.key")
    assert not (tmp_path / "marin.key").exists()


@pytest.mark.parametrize("load", [keyring.load_private_key, keyring.load_public_key])
def test_missing_key_file_says_how_to_make_one(tmp_path: Path, load: Callable[[Path], object]) -> None:
    path = tmp_path / "nope.key"
    with pytest.raises(SigningKeyError) as err:
        load(path)
    assert str(path) in str(err.value)
    assert "run `marin keygen PATH` to make one" in str(err.value)


def test_sign_with_a_missing_key_names_it(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match="run `marin keygen PATH` to make one"):
        _sign(_statement(), tmp_path / "absent.key")


def test_wrong_key_type_is_rejected(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "ec.key", tmp_path / "ec.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    for load, path in ((keyring.load_private_key, priv), (keyring.load_public_key, pub)):
        with pytest.raises(SigningKeyError, match="must be ed25519"):
            load(path)


def test_garbage_and_swapped_key_files_are_rejected(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    with pytest.raises(SigningKeyError, match="not a PEM private key"):
        keyring.load_private_key(junk)
    with pytest.raises(SigningKeyError, match="not a PEM public key"):
        keyring.load_public_key(junk)
    with pytest.raises(SigningKeyError, match=r"a private key; verify with its public key"):
        keyring.load_public_key(keys[0])


def test_key_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keyring.KEY_ENV, "/abs/env.key")
    assert keyring.key_path("keys/p.key", tmp_path) == tmp_path / "keys" / "p.key"  # explicit wins
    assert keyring.key_path(None, tmp_path) == Path("/abs/env.key")
    monkeypatch.setenv(keyring.KEY_ENV, "rel/env.key")
    assert keyring.key_path(None, tmp_path) == tmp_path / "rel" / "env.key"
    monkeypatch.delenv(keyring.KEY_ENV)
    with pytest.raises(SigningKeyError, match=r"no signing key: set report\.signing_key in params\.yaml or "
                                              r"MARIN_SIGNING_KEY, or make one with `marin keygen PATH`"):
        keyring.key_path(None, tmp_path)


# -- statement and predicate ----------------------------------------------------------------


def test_statement_shape() -> None:
    s = _statement()
    assert s["_type"] == "https://in-toto.io/Statement/v1"
    assert s["predicateType"] == "https://slsa.dev/provenance/v1"
    assert s["subject"][0] == {"name": "checkpoints/final", "digest": {"sha256": "ab" * 32}}


def test_predicate_parses_strictly_as_slsa_provenance_v1() -> None:
    byproducts = [dsse.resource(name="ledger/runs/x.jsonl", digest=DIGEST_A)]
    for predicate in (_predicate(), _predicate(byproducts=byproducts)):
        prov = json_format.ParseDict(predicate, Provenance(), ignore_unknown_fields=False)
        assert prov.build_definition.build_type == "https://marin.local/buildtypes/stage/v1"
        assert prov.run_details.builder.id == "https://marin.local/builder/local"
        assert prov.run_details.metadata.started_on.ToJsonString() == "2024-05-01T12:00:00Z"
        deps = prov.build_definition.resolved_dependencies
        assert deps[0].digest["gitCommit"] == "0" * 40
        assert deps[1].digest["sha256"] == DIGEST_B.split(":")[1]
        for rd in deps:
            ResourceDescriptor.copy_from_pb(rd).validate()
        assert json_format.MessageToDict(prov) == predicate  # protobuf's reading is ours, key for key
    assert len(prov.run_details.byproducts) == 1


def test_statement_validates_with_in_toto_attestation() -> None:
    s = _statement()
    pb = json_format.ParseDict(s, statement_pb2.Statement(), ignore_unknown_fields=False)
    Statement.copy_from_pb(pb).validate()
    subjects = [ResourceDescriptor(name=x["name"], digest=x["digest"]).pb for x in s["subject"]]
    Statement(subjects, s["predicateType"], s["predicate"]).validate()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(AttestationError, match="not of the form sha256:<64 hex>"):
        dsse.statement([("x", "md5:00")], _predicate())
    with pytest.raises(AttestationError, match="at least one subject"):
        dsse.statement([], _predicate())
    with pytest.raises(AttestationError, match="not an RFC 3339 UTC time"):
        _predicate_with(started_on="2024-05-01 12:00:00")
    with pytest.raises(AttestationError, match="not an RFC 3339 UTC time"):
        _predicate_with(started_on="2024-05-01T12:00:00+02:00")
    with pytest.raises(AttestationError, match="at least one of name, uri or digest"):
        dsse.resource()


def _predicate_with(**kw: str) -> dict:
    args = dict(build_type="b", external_parameters={}, internal_parameters={}, resolved_dependencies=[],
                builder_id="x", invocation_id="i", started_on="2024-05-01T12:00:00Z",
                finished_on="2024-05-01T12:00:01Z")
    return dsse.slsa_predicate(**(args | kw))


def test_timestamp_is_rfc3339_utc() -> None:
    ts = dsse.timestamp()
    assert ts.endswith("Z") and "+" not in ts
    json_format.ParseDict({"startedOn": ts}, Provenance().run_details.metadata)


# -- DSSE -----------------------------------------------------------------------------------


def test_pae_matches_the_dsse_spec_and_securesystemslib() -> None:
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world")
    assert dsse.pae("t", b"body") == Envelope(b"body", "t", {}).pae()


def test_sign_verifies_with_securesystemslib_and_ours(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    s = _statement()
    env = _sign(s, priv)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(env["payload"]) == rfc8785.dumps(s)
    key = _sslib_key(pub)
    accepted = Envelope.from_dict(copy.deepcopy(env)).verify([key], 1)
    assert list(accepted) == [env["signatures"][0]["keyid"]]
    assert _verify(env, pub) == s
    assert _verify(json.loads(json.dumps(env)), pub) == s  # survives a JSON round trip


def test_securesystemslib_envelope_verifies_with_ours(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    s = _statement()
    signer = CryptoSigner(serialization.load_pem_private_key(priv.read_bytes(), None), _sslib_key(pub))
    env = Envelope(rfc8785.dumps(s), "application/vnd.in-toto+json", {})
    env.sign(signer)
    assert _verify(env.to_dict(), pub) == s


def _flip_payload_byte(env: dict, other_pub: Path) -> None:
    body = bytearray(base64.b64decode(env["payload"]))
    body[len(body) // 2] ^= 0x01
    env["payload"] = base64.b64encode(bytes(body)).decode()


def _change_payload_type(env: dict, other_pub: Path) -> None:
    env["payloadType"] = "application/json"


def _change_keyid(env: dict, other_pub: Path) -> None:
    env["signatures"][0]["keyid"] = "0" * 64


TAMPERS: list[tuple[str, Callable[[dict, Path], None], bool, str]] = [
    # (name, tamper, verify with the other key, distinguishing part of the message)
    ("payload byte", _flip_payload_byte, False, "signature does not verify with key"),
    ("payloadType", _change_payload_type, False, "payloadType is 'application/json', expected"),
    ("keyid", _change_keyid, False, "the envelope's keyid was changed"),
    ("other key", lambda env, pub: None, True, "verify with the public key that signed it"),
]


@pytest.mark.parametrize(("name", "tamper", "use_other", "message"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_each_tampering_fails_with_its_own_message(
    tmp_path: Path, keys: tuple[Path, Path], name: str, tamper: Callable[[dict, Path], None],
    use_other: bool, message: str,
) -> None:
    priv, pub = keys
    _, other_pub = keyring.keygen(tmp_path / "other.key")
    env = _sign(_statement(), priv)
    tamper(env, other_pub)
    with pytest.raises(AttestationError) as err:
        _verify(env, other_pub if use_other else pub)
    assert message in str(err.value)
    assert not any(m in str(err.value) for *_, m in TAMPERS if m != message)
    # securesystemslib rejects the same envelope (its keyid rule aside, payloadType is part of PAE)
    with pytest.raises(VerificationError):
        Envelope.from_dict(copy.deepcopy(env)).verify([_sslib_key(other_pub if use_other else pub)], 1)


def test_payload_change_names_the_key(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    env = _sign(_statement(), priv)
    _flip_payload_byte(env, pub)
    kid = keyring.keyid(keyring.load_public_key(pub))
    with pytest.raises(AttestationError, match=f"signature does not verify with key {kid}: the envelope or its "
                                               "payload was changed, or it was signed with another key"):
        _verify(env, pub)


def test_malformed_envelopes_are_refused(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    env = _sign(_statement(), priv)
    with pytest.raises(AttestationError, match="needs payloadType, payload and signatures"):
        _verify({"payload": env["payload"]}, pub)
    with pytest.raises(AttestationError, match="payload is not valid base64"):
        _verify(env | {"payload": "***"}, pub)
    with pytest.raises(AttestationError, match="no signatures"):
        _verify(env | {"signatures": []}, pub)
    with pytest.raises(AttestationError, match="not an in-toto Statement v1"):
        _sign({"_type": "https://in-toto.io/Statement/v0.1"}, priv)


def test_an_unsigned_envelope_carries_the_same_payload_and_no_signature(keys: tuple[Path, Path]) -> None:
    priv, pub = keys
    stmt = _statement()
    env = _unsigned(stmt)
    assert env["signatures"] == [] and env["payload"] == _sign(stmt, priv)["payload"]
    assert not _is_signed(env) and _is_signed(_sign(stmt, priv))
    assert _read_unsigned(env) == json.loads(rfc8785.dumps(stmt))
    parsed = Envelope.from_dict(copy.deepcopy(env))  # DSSE tooling reads it...
    assert parsed.signatures == {} and json.loads(parsed.pae().split(b" ", 4)[4]) == json.loads(rfc8785.dumps(stmt))
    with pytest.raises(VerificationError):  # ...and finds nothing that vouches for it
        parsed.verify([_sslib_key(pub)], 1)
    with pytest.raises(AttestationError, match="no signatures"):
        _verify(env, pub)
    with pytest.raises(AttestationError, match="the envelope is signed: check it with verify"):
        _read_unsigned(_sign(stmt, priv))
    with pytest.raises(AttestationError, match="payloadType is"):
        _read_unsigned(env | {"payloadType": "application/json"})
    with pytest.raises(AttestationError, match="not an in-toto Statement v1"):
        _unsigned({"_type": "https://in-toto.io/Statement/v0.1"})
