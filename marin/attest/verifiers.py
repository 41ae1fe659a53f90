"""Who a verification counts for: the lab's list of verifiers it vouches for, and a reader's own.

A signed verification summary (VSA) proves that the holder of an ed25519 key signed what a
``marin verify`` run recorded in the ledger. It cannot prove that the key holder is someone
other than the lab: anyone, the lab included, can make any number of keys (sybils). So, as in
sigstore's trusted root and in-toto's layout (the verifier chooses the keys it trusts; a
signature by an unknown key proves nothing), a key counts only by a trust decision made
outside the signature:

- ``verifications/verifiers.json`` is the lab's list: each key with a name, a contact and where
  the key is published, and its role (``lab``: the lab's own keys; ``third-party``). The report
  reads it as an input and its signature covers it, so the lab answers for every name it lists.
- ``marin report verify --trust FILE`` recounts with the reader's own list (the same format;
  ``role`` may be left out), which is the only list a reader need not take on the lab's word.

The lab's report signing key is always the lab's own, listed or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from marin.attest.keyring import is_keyid
from marin.errors import MarinError

FILE = "verifications/verifiers.json"
SCHEMA = "marin.verifiers@1"
Role = Literal["lab", "third-party"]  # the lab's own key, or a verifier the lab (or a reader) vouches for
LAB: Role = "lab"
THIRD_PARTY: Role = "third-party"
ROLES: tuple[Role, ...] = (LAB, THIRD_PARTY)
MAX_BYTES = 1 << 20  # a list of verifiers, not a database
_FIELDS = ("name", "contact", "published")
_TEXT_MAX = 300
EXAMPLE = {"schema": SCHEMA, "verifiers": [{
    "keyid": "<sha256 of the raw ed25519 public key: the name of its verifications/keys/ file>",
    "name": "Example University NLP group", "contact": "verify@example.org",
    "published": "https://example.org/keys/marin-verify.pub", "role": THIRD_PARTY}]}


class TrustListError(MarinError):
    """A verifiers list that is not one: the message names the file and the entry."""


@dataclass(frozen=True)
class ListedVerifier:
    """One entry of a verifiers list (a ``marin.verify`` Verifier is the one who replays a run)."""

    keyid: str
    name: str
    contact: str
    published: str
    role: Role

    def to_dict(self) -> dict[str, str]:
        return {"keyid": self.keyid, "name": self.name, "contact": self.contact, "published": self.published,
                "role": self.role}


@dataclass(frozen=True)
class TrustList:
    """Verifiers by key id; ``where``: the file it came from (for messages)."""

    where: str = ""
    by_key: dict[str, ListedVerifier] = field(default_factory=dict)

    def role(self, kid: str | None) -> Role | None:
        v = self.by_key.get(kid or "")
        return v.role if v else None

    def get(self, kid: str | None) -> ListedVerifier | None:
        return self.by_key.get(kid or "")


def parse(data: bytes, where: str, default_role: Role | None = None) -> TrustList:
    """A verifiers list from its bytes, validated: a TrustListError naming ``where`` and the entry.
    ``default_role``: the role of entries without one (a reader's list); None: every entry needs one."""
    if len(data) > MAX_BYTES:
        raise TrustListError(f"{where}: {len(data)} bytes, over the {MAX_BYTES}-byte cap of a verifiers list")
    try:
        doc: object = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TrustListError(f"{where}: not JSON ({type(e).__name__}: {str(e)[:80]}); see {FILE} in "
                             "docs/guide/report.md for the format") from None
    top = cast(dict[str, object], doc) if isinstance(doc, dict) else {}
    entries = top.get("verifiers")
    if top.get("schema") != SCHEMA or not isinstance(entries, list):
        raise TrustListError(f'{where}: not a verifiers list (an object with "schema": "{SCHEMA}" and a '
                             '"verifiers" list); see docs/guide/report.md, Independent verification')
    found: dict[str, ListedVerifier] = {}
    for i, entry in enumerate(cast(list[object], entries)):
        v = _entry(entry, f"{where}: verifiers[{i}]", default_role)
        if v.keyid in found:
            raise TrustListError(f"{where}: verifiers[{i}]: key {v.keyid} is listed twice; keep one entry")
        found[v.keyid] = v
    return TrustList(where, found)


def _entry(value: object, where: str, default_role: Role | None) -> ListedVerifier:
    if not isinstance(value, dict):
        raise TrustListError(f"{where}: not an object")
    entry = cast(dict[str, object], value)
    kid = entry.get("keyid")
    if not isinstance(kid, str) or not is_keyid(kid):
        raise TrustListError(f"{where}: keyid {kid!r} is not a key id (64 lowercase hex digits, the sha256 of "
                             "the raw ed25519 public key)")
    said = entry.get("role", default_role)
    role: Role | None = next((r for r in ROLES if r == said), None)
    if role is None:
        raise TrustListError(f"{where}: role {said!r}; roles are {', '.join(ROLES)}")
    text: dict[str, str] = {}
    for k in _FIELDS:
        value = entry.get(k, "" if default_role else None)
        if not isinstance(value, str) or (default_role is None and not value.strip()) or len(value) > _TEXT_MAX:
            raise TrustListError(f"{where}: {k} must be a non-empty string of at most {_TEXT_MAX} characters "
                                 "(who the verifier is, how to reach them, where their public key is published)")
        text[k] = " ".join(value.split())  # one line in a table
    unknown = sorted(set(entry) - {"keyid", "role", *_FIELDS})
    if unknown:
        raise TrustListError(f"{where}: unknown field {unknown[0]!r}; fields are keyid, role, {', '.join(_FIELDS)}")
    return ListedVerifier(kid, text["name"], text["contact"], text["published"], role)


def load_reader_list(path: Path) -> TrustList:
    """``--trust FILE``: the reader's own list (entries may leave out role, name, contact, published)."""
    from marin import readers

    try:
        data = readers.read_bytes(path, "trust")
    except FileNotFoundError:
        raise TrustListError(f"{path}: no such file (--trust takes a verifiers list: {FILE}'s format)") from None
    return parse(data, str(path), default_role=THIRD_PARTY)
