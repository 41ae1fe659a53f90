"""Signed statements: in-toto Statement v1 with a SLSA Provenance v1 (or Verification Summary)
predicate in a DSSE envelope, built, signed and checked with ed25519 keys (:mod:`marin.attest.keyring`).
The envelope and the statement are the typed models of :mod:`marin.attest.models`.
References: https://github.com/in-toto/attestation/blob/main/spec/v1, https://slsa.dev/spec/v1.0/provenance,
https://github.com/secure-systems-lab/dsse.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from marin import hashing
from marin.attest.keyring import keyid, load_private_key, load_public_key
from marin.attest.models import (
    PAYLOAD_TYPE,
    STATEMENT_TYPE,
    AttestationError,
    Envelope,
    JsonObject,
    Signature,
    Statement,
    lookup,
)

PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"


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
    annotations: Mapping[str, object] | None = None,
) -> JsonObject:
    """An in-toto ResourceDescriptor from a ``sha256:<hex>`` digest and/or a git commit."""
    rd: JsonObject = {}
    if name:
        rd["name"] = name
    if uri:
        rd["uri"] = uri
    digests: dict[str, str] = {}
    if digest is not None:
        digests["sha256"] = _sha256_hex(digest, name or uri or "resource")
    if git_commit is not None:
        digests["gitCommit"] = git_commit
    if digests:
        rd["digest"] = digests
    if annotations:
        rd["annotations"] = dict(annotations)
    if not rd.get("name") and not rd.get("uri") and not digests:
        raise AttestationError("a resource needs at least one of name, uri or digest")
    return rd


def _sha256_hex(digest: str, name: str) -> str:
    try:
        return hashing.parse(digest).hex()
    except ValueError:
        raise AttestationError(f"{name}: digest {digest!r} is not of the form sha256:<64 hex>") from None


def statement(subjects: Sequence[tuple[str, str]], predicate: Mapping[str, object],
              predicate_type: str = PROVENANCE_TYPE) -> Statement:
    """An in-toto Statement v1 about ``(name, "sha256:<hex>")`` subjects with a predicate of
    ``predicate_type`` (default: SLSA Provenance v1), as its canonical JSON reads back: what is signed."""
    if not subjects:
        raise AttestationError("a statement needs at least one subject (name, sha256 digest)")
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": _sha256_hex(d, name)}} for name, d in subjects],
        "predicateType": predicate_type,
        "predicate": predicate,
    }
    return Statement.parse(hashing.canonical_json(doc))


def slsa_predicate(
    *,
    build_type: str,
    external_parameters: Mapping[str, object],
    internal_parameters: Mapping[str, object],
    resolved_dependencies: Sequence[Mapping[str, object]],
    builder_id: str,
    invocation_id: str,
    started_on: str,
    finished_on: str,
    byproducts: Sequence[Mapping[str, object]] | None = None,
) -> JsonObject:
    """A SLSA Provenance v1 predicate; dependencies and byproducts are ResourceDescriptors (see ``resource``)."""
    for label, ts in (("started_on", started_on), ("finished_on", finished_on)):
        _check_timestamp(label, ts)
    run_details: JsonObject = {
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


def sign(statement: Statement, private_key_path: Path) -> Envelope:
    """A DSSE envelope holding the RFC 8785 canonical ``statement``, signed with the ed25519 key."""
    key = load_private_key(private_key_path)
    body = statement.canonical()
    sig = key.sign(pae(PAYLOAD_TYPE, body))
    return Envelope(body, (Signature(keyid(key), base64.b64encode(sig).decode("ascii")),))


def unsigned(statement: Statement) -> Envelope:
    """A DSSE envelope holding the canonical ``statement`` with no signatures (``"signatures": []``):
    the shape DSSE and in-toto define, for a report built where no signing key exists."""
    return Envelope(statement.canonical())


def read_unsigned(envelope: Envelope) -> Statement:
    """The statement of an envelope without signatures (nothing vouches for it: check it otherwise)."""
    if envelope.signed:
        raise AttestationError("the envelope is signed: check it with verify()")
    return Statement.parse(envelope.payload, "unsigned")


def statement_of(envelope: Envelope) -> Statement:
    """The statement an envelope carries, its signatures NOT checked (for reading values out of an
    envelope that ``verify`` accepted before, or that is listed as not verified)."""
    return Statement.parse(envelope.payload, "envelope")


def verify(envelope: Envelope, public_key: Path | Ed25519PublicKey) -> Statement:
    """Check a DSSE envelope against an ed25519 public key (or its PEM file); return the statement it
    carries. Steps 1-2 (shape, payload type) were ``Envelope.from_json``'s."""
    key = public_key if isinstance(public_key, Ed25519PublicKey) else load_public_key(public_key)
    kid = keyid(key)
    sigs = envelope.signatures
    if not sigs:
        raise AttestationError("envelope has no signatures")
    message = pae(envelope.payload_type, envelope.payload)
    # 3. a signature by this key
    mine = [s for s in sigs if s.keyid == kid]
    if not mine:
        others = sorted({str(s.keyid) for s in sigs})
        if any(_verifies(key, s.raw(), message) for s in sigs):
            raise AttestationError(
                f"signature keyid {', '.join(others)} does not match key {kid}, yet the signature verifies "
                "with that key: the envelope's keyid was changed"
            )
        raise AttestationError(
            f"envelope is signed by key {', '.join(others)}, not by {kid}: verify with the public key that signed it"
        )
    # 4. the signature over PAE(payloadType, payload)
    if not any(_verifies(key, s.raw(), message) for s in mine):
        raise AttestationError(
            f"signature does not verify with key {kid}: the envelope or its payload was changed, "
            "or it was signed with another key"
        )
    return Statement.parse(envelope.payload, "signed")  # 5. the payload is a Statement v1


def _verifies(key: Ed25519PublicKey, sig: bytes, message: bytes) -> bool:
    try:
        key.verify(sig, message)
    except InvalidSignature:
        return False
    return True


def dependency_digest(stmt: Statement, uri: str) -> str | None:
    """The sha256 hex of the resolved dependency at ``uri`` in a SLSA Provenance predicate (None: none)."""
    deps = _at(stmt.predicate, "/buildDefinition/resolvedDependencies")
    for dep in cast(list[object], deps) if isinstance(deps, list) else []:
        if _at(dep, "/uri") == uri and isinstance(digest := _at(dep, "/digest/sha256"), str):
            return digest
    return None


def _at(doc: object, pointer: str) -> object:
    try:
        return lookup(doc, pointer)
    except (LookupError, ValueError):
        return None
