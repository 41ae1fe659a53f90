"""Typed attestations, each parsed once with a one-line error for a bad shape: a DSSE envelope
(:class:`Envelope`), the in-toto Statement v1 it carries (:class:`Statement`) and marin's SLSA
verification summary (:class:`Vsa`). As in sigstore-python's ``models.py``, an object is validated
when it is loaded; past that point marin reads fields, never raw JSON.
References: https://github.com/secure-systems-lab/dsse, https://github.com/in-toto/attestation/blob/main/spec/v1,
https://slsa.dev/spec/v1.0/verification_summary.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from marin import hashing
from marin.errors import MarinError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
VSA_TYPE = "https://slsa.dev/verification_summary/v1"
NS = "marin"  # a VSA predicate's marin-specific fields live under this key

JsonObject = dict[str, object]
Result = Literal["PASSED", "FAILED"]
PASSED: Result = "PASSED"
FAILED: Result = "FAILED"


class AttestationError(MarinError):
    """A statement cannot be built, or an envelope or statement is not what it claims to be."""


def _object(value: object) -> JsonObject | None:
    """``value`` as a JSON object (string keys, as ``json.loads`` makes them), or None."""
    return cast(JsonObject, value) if isinstance(value, dict) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def lookup(doc: object, pointer: str) -> object:
    """The value at an RFC 6901 JSON ``pointer`` in parsed JSON; a LookupError or ValueError when
    there is none."""
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(doc, list):
            doc = cast(list[object], doc)[int(part)]
        elif (obj := _object(doc)) is not None:
            doc = obj[part]
        else:
            raise KeyError(pointer)
    return doc


def b64decode(value: object, what: str) -> bytes:
    """Base64 text (either alphabet: DSSE lets signers use the URL-safe one), decoded."""
    if not isinstance(value, str):
        raise AttestationError(f"envelope {what} is not a base64 string")
    standard = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError(f"envelope {what} is not valid base64") from None


# -- DSSE envelope --------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """One DSSE signature as the envelope holds it; ``sig`` is decoded only when it is checked."""

    keyid: str | None  # None: absent, or not a string
    sig: object  # the base64 text as written (see ``raw``)

    def raw(self) -> bytes:
        return b64decode(self.sig, "signature")


@dataclass(frozen=True)
class Envelope:
    """A DSSE v1 envelope of an in-toto statement (payload type ``PAYLOAD_TYPE``)."""

    payload: bytes
    signatures: tuple[Signature, ...] = ()
    payload_type: str = PAYLOAD_TYPE

    @property
    def signed(self) -> bool:
        """Whether it carries any signature (an unsigned one has ``"signatures": []``)."""
        return bool(self.signatures)

    @classmethod
    def parse(cls, data: bytes) -> Envelope:
        """An envelope from a file's bytes."""
        try:
            value: object = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise AttestationError(f"not JSON ({type(e).__name__})") from None
        return cls.from_json(value)

    @classmethod
    def from_json(cls, value: object) -> Envelope:
        """An envelope from parsed JSON: its shape, its payload (base64) and its payload type."""
        env = _object(value)
        if env is None or not {"payloadType", "payload", "signatures"} <= env.keys():
            raise AttestationError("not a DSSE envelope: it needs payloadType, payload and signatures")
        payload = b64decode(env["payload"], "payload")
        sigs = env["signatures"]
        if not isinstance(sigs, list):
            raise AttestationError("envelope signatures is not a list")
        if env["payloadType"] != PAYLOAD_TYPE:
            raise AttestationError(f"payloadType is {env['payloadType']!r}, expected {PAYLOAD_TYPE!r}")
        parsed: list[Signature] = []
        for i, s in enumerate(cast(list[object], sigs)):
            if (sig := _object(s)) is None:
                raise AttestationError(f"envelope signatures[{i}] is not an object with keyid and sig")
            parsed.append(Signature(_str(sig.get("keyid")), sig.get("sig")))
        return cls(payload, tuple(parsed))

    def to_json(self) -> JsonObject:
        """The envelope as DSSE writes it."""
        return {"payloadType": self.payload_type, "payload": base64.b64encode(self.payload).decode("ascii"),
                "signatures": [{"keyid": s.keyid, "sig": s.sig} for s in self.signatures]}


# -- in-toto statement ----------------------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """A statement's subject: a name and its digests (algorithm -> hex)."""

    name: str
    digest: Mapping[str, str]


@dataclass(frozen=True)
class Statement:
    """An in-toto Statement v1; ``doc`` is the statement as JSON (what is signed, what pointers resolve in)."""

    subjects: tuple[Subject, ...]
    predicate_type: str
    predicate: JsonObject
    doc: JsonObject

    @classmethod
    def parse(cls, body: bytes, what: str = "statement") -> Statement:
        """A statement from an envelope's payload; ``what`` names the envelope in messages."""
        try:
            value: object = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise AttestationError(f"{what} payload is not JSON ({e})") from None
        return cls.from_json(value, f"{what} payload")

    @classmethod
    def from_json(cls, value: object, what: str = "statement") -> Statement:
        """A statement from parsed JSON: ``_type``, subjects, predicate type and predicate."""
        doc = _object(value)
        if doc is None or doc.get("_type") != STATEMENT_TYPE:
            raise AttestationError(f"{what} is not an in-toto Statement v1 (_type must be {STATEMENT_TYPE})")
        subjects = doc.get("subject")
        predicate_type, predicate = doc.get("predicateType"), _object(doc.get("predicate", {}))
        if not isinstance(subjects, list) or not isinstance(predicate_type, str) or predicate is None:
            raise AttestationError(f"{what} is not an in-toto Statement v1: it needs a subject list, a predicateType "
                                   "string and a predicate object")
        return cls(tuple(_subject(s, f"{what}: subject[{i}]") for i, s in enumerate(cast(list[object], subjects))),
                   predicate_type, predicate, doc)

    def canonical(self) -> bytes:
        """The RFC 8785 bytes of the statement: an envelope's payload."""
        return hashing.canonical_json(self.doc)

    def digests(self) -> dict[str, str]:
        """Each subject's name -> ``sha256:<hex>``; a KeyError for a subject without a sha256 digest."""
        return {s.name: "sha256:" + s.digest["sha256"] for s in self.subjects}


def _subject(value: object, what: str) -> Subject:
    s = _object(value)
    digest = _object(s.get("digest")) if s is not None else None
    name = s.get("name", "") if s is not None else None
    if digest is None or not isinstance(name, str) or not all(isinstance(d, str) for d in digest.values()):
        raise AttestationError(f"{what} is not a name with a digest (algorithm -> hex)")
    return Subject(name, cast(dict[str, str], digest))


# -- SLSA verification summary --------------------------------------------------------------


@dataclass(frozen=True)
class Vsa:
    """A marin verification summary: what the policy reads of it (the rest stays in ``statement.doc``)."""

    statement: Statement
    run_id: str
    result: Result  # predicate.verificationResult
    mode: str  # "full" or "segments" as marin writes it
    verifier_keyid: str | None  # predicate.marin.verifier.keyid
    record_seq: int | None  # the verification record it cites (predicate.marin.verification_record)
    record_digest: str | None

    @classmethod
    def from_statement(cls, stmt: Statement) -> Vsa:
        """A VSA from a statement: its predicate type and the marin fields the policy reads."""
        if stmt.predicate_type != VSA_TYPE:
            raise AttestationError(f"unknown predicate type {stmt.predicate_type!r} (expected {VSA_TYPE})")
        p = stmt.predicate
        m = _object(p.get(NS))
        said = p.get("verificationResult")
        result = PASSED if said == PASSED else FAILED if said == FAILED else None
        if m is None or any(k not in m for k in ("run_id", "result", "mode", "verifier")) or result is None:
            raise AttestationError(f"not a marin verification summary (predicate.{NS} with run_id, result, mode "
                                   "and verifier)")
        run_id, verifier = m["run_id"], _object(m["verifier"])
        if not isinstance(run_id, str) or verifier is None:
            raise AttestationError(f"a malformed verification summary (predicate.{NS}.run_id must be a string, "
                                   "verifier an object)")
        ref = _object(m.get("verification_record")) or {}
        seq = ref.get("seq")
        return cls(stmt, run_id, result, str(m["mode"]), _str(verifier.get("keyid")),
                   seq if isinstance(seq, int) and not isinstance(seq, bool) else None, _str(ref.get("digest")))

    @property
    def marin(self) -> JsonObject:
        """The predicate's marin fields, as signed."""
        return cast(JsonObject, self.statement.predicate[NS])
