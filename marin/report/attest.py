"""Signed provenance: in-toto Statement v1 with a SLSA Provenance v1 predicate in a DSSE envelope.

Keys are ed25519 PEM files (``marin keygen``); a key's id is the sha256 hex of its raw 32
public bytes. References: https://github.com/in-toto/attestation/blob/main/spec/v1,
https://slsa.dev/spec/v1.0/provenance, https://github.com/secure-systems-lab/dsse.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from marin import fsutil, hashing, readers
from marin.errors import MarinError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
KEY_ENV = "MARIN_SIGNING_KEY"
_KEYGEN_HINT = "run `marin keygen PATH` to make one"


class SigningKeyError(MarinError):
    """A signing or verification key is missing, unreadable, not ed25519, or would be overwritten."""


class AttestationError(MarinError):
    """A statement cannot be built, or an envelope does not verify."""


# -- keys -----------------------------------------------------------------------------------


def keygen(private_path: Path, public_path: Path | None = None) -> tuple[Path, Path]:
    """Write a new ed25519 private key (PEM PKCS8, mode 0600) and its public key (``<private>.pub``)."""
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path is not None else _default_public(private_path)
    for p in (private_path, public_path):
        if p.exists():
            raise SigningKeyError(f"{p}: already exists; marin never overwrites a key: move it away or pick a new path")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_new_private(private_path, private_pem)
    fsutil.write_bytes(public_path, public_pem(key.public_key()))
    return private_path, public_path


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    """The public key as a PEM (SubjectPublicKeyInfo) file's bytes, as ``keygen`` writes ``<key>.pub``."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _default_public(private_path: Path) -> Path:
    return private_path.with_name(private_path.name + ".pub")


def _write_new_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 (O_EXCL: fail rather than replace), write, fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningKeyError(f"{path}: already exists; marin never overwrites a key: move it away") from None
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow the mode; be explicit anyway
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)  # never leave a half-written key behind
        raise
    fsutil.fsync_dir(path.parent)


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return readers.read_bytes(os.path.realpath(path), "key", SigningKeyError)  # a link to a key is fine
    except FileNotFoundError:
        raise SigningKeyError(f"{path}: no such {what} key file; {_KEYGEN_HINT}") from None
    except PermissionError as e:
        raise SigningKeyError(f"{path}: cannot read {what} key ({e.strerror}); check path and permissions") from None


def _not_ed25519(path: Path, key: object) -> SigningKeyError:
    kind = type(key).__name__.lstrip("_")
    return SigningKeyError(f"{path}: a {kind}, but marin keys must be ed25519; {_KEYGEN_HINT}")


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in a PEM file."""
    data = _read_key_file(path, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningKeyError(f"{path}: the key is encrypted; marin needs an unencrypted PKCS8 PEM key") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise SigningKeyError(f"{path}: not a PEM private key ({e}); {_KEYGEN_HINT}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise _not_ed25519(path, key)
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in a PEM (SubjectPublicKeyInfo) file."""
    return public_key_from_pem(_read_key_file(path, "public"), Path(path))


def public_key_from_pem(data: bytes, path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in PEM ``data`` (read from ``path``, which messages name)."""
    if b"PRIVATE KEY" in data:
        raise SigningKeyError(f"{path}: a private key; verify with its public key ({_default_public(Path(path))})")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise SigningKeyError(f"{path}: not a PEM public key ({e}); {_KEYGEN_HINT}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise _not_ed25519(path, key)
    return key


def keyid(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the key's raw 32 public bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def key_path(explicit: str | None, root: Path) -> Path:
    """The signing key: ``explicit`` (report.signing_key), else $MARIN_SIGNING_KEY; relative to ``root``."""
    chosen = explicit or os.environ.get(KEY_ENV)
    if not chosen:
        raise SigningKeyError(
            f"no signing key: set report.signing_key in params.yaml or {KEY_ENV}, or make one with `marin keygen PATH`"
        )
    path = Path(chosen).expanduser()
    return path if path.is_absolute() else Path(root) / path


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


def is_signed(envelope: Any) -> bool:
    """Whether the envelope carries any signature (an unsigned one has ``"signatures": []``)."""
    return isinstance(envelope, dict) and bool(envelope.get("signatures"))


def _payload(envelope: Any) -> bytes:
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


def read_unsigned(envelope: Any) -> dict[str, Any]:
    """The statement of an envelope without signatures (nothing vouches for it: check it otherwise)."""
    if is_signed(envelope):
        raise AttestationError("the envelope is signed: check it with verify()")
    return _statement_of(_payload(envelope), "unsigned")


def statement_of(envelope: Any) -> dict[str, Any]:
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
