"""Signed statements: in-toto Statement v1 with a SLSA Provenance v1 (or Verification Summary)
predicate in a DSSE envelope, signed and checked with ed25519 keys (:mod:`marin.attest.keyring`).
References: https://github.com/in-toto/attestation/blob/main/spec/v1,
https://slsa.dev/spec/v1.0/provenance, https://github.com/secure-systems-lab/dsse.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from marin import hashing
from marin.attest.keyring import keyid, load_private_key, load_public_key
from marin.errors import MarinError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


class AttestationError(MarinError):
    """A statement cannot be built, or an envelope does not verify."""


# -- statement and predicate ----------------------------------------------------------------


def timestamp(when: datetime | None = None) -> str:
    """RFC 3339 UTC with a ``Z`` suffix, e.g. ``2024-05-01T12:00:00Z`` (now when ``when`` is None)."""
    when = (when or datetime.now(UTC)).astimezone(UTC)
    return when.isoformat().replace("+00:00", "Z")


def resource(
    *,
    name: str | None = None,
    uri: str | None = None,
    digest: str | None = None,
    git_commit: str | None = None,
    annotations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An in-toto ResourceDescriptor from a ``sha256:<hex>`` digest and/or a git commit."""
    rd: dict[str, Any] = {}
    if name:
        rd["name"] = name
    if uri:
        rd["uri"] = uri
    digests = {}
    if digest is not None:
        digests["sha256"] = _sha256_hex(digest, name or uri or "resource")
    if git_commit is not None:
        digests["gitCommit"] = git_commit
    if digests:
        rd["digest"] = digests
    if annotations:
        rd["annotations"] = annotations
    if not rd.get("name") and not rd.get("uri") and not digests:
        raise AttestationError("a resource needs at least one of name, uri or digest")
    return rd


def _sha256_hex(digest: str, name: str) -> str:
    try:
        return hashing.parse(digest).hex()
    except ValueError:
        raise AttestationError(f"{name}: digest {digest!r} is not of the form sha256:<64 hex>") from None


def statement(subjects: list[tuple[str, str]], predicate: dict[str, Any],
              predicate_type: str = PROVENANCE_TYPE) -> dict[str, Any]:
    """An in-toto Statement v1 about ``(name, "sha256:<hex>")`` subjects with a predicate of
    ``predicate_type`` (default: SLSA Provenance v1)."""
    if not subjects:
        raise AttestationError("a statement needs at least one subject (name, sha256 digest)")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": _sha256_hex(d, name)}} for name, d in subjects],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def slsa_predicate(
    *,
    build_type: str,
    external_parameters: dict[str, Any],
    internal_parameters: dict[str, Any],
    resolved_dependencies: list[dict[str, Any]],
    builder_id: str,
    invocation_id: str,
    started_on: str,
    finished_on: str,
    byproducts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A SLSA Provenance v1 predicate; dependencies and byproducts are ResourceDescriptors (see ``resource``)."""
    for label, ts in (("started_on", started_on), ("finished_on", finished_on)):
        _check_timestamp(label, ts)
    run_details: dict[str, Any] = {
        "builder": {"id": builder_id},
        "metadata": {"invocationId": invocation_id, "startedOn": started_on, "finishedOn": finished_on},
    }
    if byproducts:
        run_details["byproducts"] = list(byproducts)
    return {
        "buildDefinition": {
            "buildType": build_type,
            "externalParameters": external_parameters,
            "internalParameters": internal_parameters,
            "resolvedDependencies": list(resolved_dependencies),
        },
        "runDetails": run_details,
    }


def _check_timestamp(label: str, ts: str) -> None:
    try:
        ok = ts.endswith("Z") and datetime.fromisoformat(ts).utcoffset() is not None
    except ValueError:
        ok = False
    if not ok:
        raise AttestationError(f"{label} {ts!r} is not an RFC 3339 UTC time like 2024-05-01T12:00:00Z; use timestamp()")


# -- DSSE -----------------------------------------------------------------------------------


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(body), body)


def sign(statement: dict[str, Any], private_key_path: Path) -> dict[str, Any]:
    """A DSSE envelope holding the RFC 8785 canonical ``statement``, signed with the ed25519 key."""
    got = statement.get("_type")
    if got != STATEMENT_TYPE:
        raise AttestationError(f"not an in-toto Statement v1 (_type is {got!r}); build it with statement()")
    key = load_private_key(private_key_path)
    body = hashing.canonical_json(statement)
    sig = key.sign(pae(PAYLOAD_TYPE, body))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode("ascii"),
        "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}],
    }


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise AttestationError(f"envelope {what} is not a base64 string")
    standard = value.replace("-", "+").replace("_", "/")  # DSSE lets signers use the URL-safe alphabet
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError(f"envelope {what} is not valid base64") from None


def unsigned(statement: dict[str, Any]) -> dict[str, Any]:
    """A DSSE envelope holding the canonical ``statement`` with no signatures (``"signatures": []``):
    the shape DSSE and in-toto define, for a report built where no signing key exists."""
    got = statement.get("_type")
    if got != STATEMENT_TYPE:
        raise AttestationError(f"not an in-toto Statement v1 (_type is {got!r}); build it with statement()")
    body = hashing.canonical_json(statement)
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode("ascii"), "signatures": []}


def is_signed(envelope: object) -> bool:
    """Whether the envelope carries any signature (an unsigned one has ``"signatures": []``)."""
    return isinstance(envelope, dict) and bool(envelope.get("signatures"))


def _payload(envelope: object) -> bytes:
    """Steps 1-2 of verification: the envelope's shape and payload type; the payload bytes."""
    if not isinstance(envelope, dict) or not {"payloadType", "payload", "signatures"} <= envelope.keys():
        raise AttestationError("not a DSSE envelope: it needs payloadType, payload and signatures")
    body = _b64(envelope["payload"], "payload")
    if not isinstance(envelope["signatures"], list):
        raise AttestationError("envelope signatures is not a list")
    if envelope["payloadType"] != PAYLOAD_TYPE:
        raise AttestationError(f"payloadType is {envelope['payloadType']!r}, expected {PAYLOAD_TYPE!r}")
    return body


def _statement_of(body: bytes, what: str) -> dict[str, Any]:
    try:
        stmt = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AttestationError(f"{what} payload is not JSON ({e})") from None
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise AttestationError(f"{what} payload is not an in-toto Statement v1 (_type must be {STATEMENT_TYPE})")
    return stmt


def read_unsigned(envelope: object) -> dict[str, Any]:
    """The statement of an envelope without signatures (nothing vouches for it: check it otherwise)."""
    if is_signed(envelope):
        raise AttestationError("the envelope is signed: check it with verify()")
    return _statement_of(_payload(envelope), "unsigned")


def statement_of(envelope: object) -> dict[str, Any]:
    """The statement an envelope carries, its signatures NOT checked (for reading values out of an
    envelope that ``verify`` accepted before, or that is listed as not verified)."""
    return _statement_of(_payload(envelope), "envelope")


def verify(envelope: dict[str, Any], public_key: Path | Ed25519PublicKey) -> dict[str, Any]:
    """Check a DSSE envelope against an ed25519 public key (or its PEM file); return the statement it carries."""
    key = public_key if isinstance(public_key, Ed25519PublicKey) else load_public_key(public_key)
    kid = keyid(key)
    body = _payload(envelope)  # 1. shape, 2. payload type
    sigs = envelope["signatures"]
    if not sigs or not all(isinstance(s, dict) for s in sigs):
        raise AttestationError("envelope has no signatures")
    message = pae(PAYLOAD_TYPE, body)
    # 3. a signature by this key
    mine = [s for s in sigs if s.get("keyid") == kid]
    if not mine:
        others = sorted({str(s.get("keyid")) for s in sigs})
        if any(_verifies(key, _b64(s.get("sig"), "signature"), message) for s in sigs):
            raise AttestationError(
                f"signature keyid {', '.join(others)} does not match key {kid}, yet the signature verifies "
                "with that key: the envelope's keyid was changed"
            )
        raise AttestationError(
            f"envelope is signed by key {', '.join(others)}, not by {kid}: verify with the public key that signed it"
        )
    # 4. the signature over PAE(payloadType, payload)
    if not any(_verifies(key, _b64(s.get("sig"), "signature"), message) for s in mine):
        raise AttestationError(
            f"signature does not verify with key {kid}: the envelope or its payload was changed, "
            "or it was signed with another key"
        )
    return _statement_of(body, "signed")  # 5. the payload is a Statement v1


def _verifies(key: Ed25519PublicKey, sig: bytes, message: bytes) -> bool:
    try:
        key.verify(sig, message)
    except InvalidSignature:
        return False
    return True
