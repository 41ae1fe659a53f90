"""Which signed verification summaries count, and for whom: the trust policy the report's Independent
verification section and ``marin report verify --trust`` both apply.

After sigstore-python's ``verify/policy.py``: small checks, each returning a :class:`Verdict`, composed
with :func:`all_of`. A VSA file filed under a run is opened once (:func:`open_claim`: its envelope,
signature and statement) into a :class:`Claim`, which every check reads:

1. :func:`signed`: its signature verifies with the public key committed under its key id, its statement
   is a marin VSA about the run it is filed under (that run's recorded digests, its own key as verifier),
   and it holds every value the report cites; else ``invalid``, ``unsigned`` or ``unverifiable``;
2. :func:`backed`: it is exactly the summary of a verification record of that run, made for its key,
   recorded between the run's end and the report's build (``vsa.backing_problem``); else ``unbacked``;
3. :func:`vouched`: its key is the lab's report key, or one the lab lists in verifications/verifiers.json
   (under the report's signature); else ``unvouched``. :func:`trusted_by` is a reader's own list instead,
   where the lab's key never counts as independent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, cast

from marin.attest import dsse, keyring, verifiers, vsa
from marin.attest.models import AttestationError, Envelope, Vsa, lookup
from marin.attest.verifiers import Role, TrustList
from marin.ledger.store import RunLog

Status = Literal["valid", "invalid", "unsigned", "unverifiable", "unbacked", "unvouched"]


@dataclass(frozen=True)
class Verdict:
    """What a check (or a policy) makes of a claim: ``valid``, or another status and why."""

    status: Status
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "valid"


VALID = Verdict("valid")


@dataclass(frozen=True)
class Claim:
    """One VSA file filed under a run, opened once: the key id it is filed under (None until the file is
    known to be signed and filed under a key id), its summary (None: it did not open) and the verdict of
    opening it, which :func:`signed` returns."""

    path: str  # verifications/<run id>/<key id>.intoto.json
    log: RunLog  # the run it is filed under
    keyid: str | None
    vsa: Vsa | None
    opened: Verdict


Check = Callable[[Claim], Verdict]


def open_claim(path: str, data: bytes, keys: Mapping[str, bytes], log: RunLog) -> Claim:
    """The VSA ``data`` filed at ``path`` under ``log``'s run, its signature checked with the public key
    filed under its key id (``keys``: project-relative path of a verifications/keys/ file -> its bytes)."""
    kid = PurePosixPath(path).name.removesuffix(vsa.SUFFIX)

    def fail(status: Status, why: str, keyid: str | None = kid) -> Claim:
        return Claim(path, log, keyid, None, Verdict(status, why))

    try:
        value: object = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return fail("invalid", f"not JSON ({type(e).__name__})", None)
    if not _has_signatures(value):
        return fail("unsigned", "no signatures: nobody vouches for it", None)
    if not keyring.is_keyid(kid):
        return fail("invalid", f"filed under {kid!r}, not a key id (64 hex digits)", None)
    pub = f"{vsa.DIR}/{vsa.KEYS}/{kid}.pub"
    if pub not in keys:
        return fail("unverifiable", f"public key not found ({pub})")
    try:
        key = keyring.public_key_from_pem(keys[pub], Path(pub))
        if (there := keyring.keyid(key)) != kid:
            return fail("invalid", f"{pub} holds another key ({there})")
        v = Vsa.from_statement(dsse.verify(Envelope.from_json(value), key))
    except (AttestationError, keyring.SigningKeyError) as e:
        return fail("invalid", str(e))
    why = _about_problem(v, log, kid) or _missing(v)
    return Claim(path, log, kid, v, Verdict("invalid", why) if why else VALID)


def _has_signatures(value: object) -> bool:
    """Whether the parsed JSON carries any signature (before its shape is checked: an unsigned file is
    ``unsigned``, whatever else is wrong with it)."""
    return isinstance(value, dict) and bool(cast(dict[str, object], value).get("signatures"))


def _about_problem(v: Vsa, log: RunLog, kid: str) -> str | None:
    """Why a signed VSA is not about ``log``'s run as the ledger recorded it, by key ``kid`` (None: it is)."""
    if v.run_id != log.run_id:
        return f"its subject is run {v.run_id}, but it is filed under {log.run_id}"
    want = {f"{vsa.resource_uri(log.run_id)}#run.finished": log.end.digest,
            f"{vsa.resource_uri(log.run_id)}#recipe": log.recipe_digest}
    got = {s.name: "sha256:" + str(s.digest.get("sha256")) for s in v.statement.subjects}
    wrong = [n for n, d in want.items() if got.get(n) != d]
    if wrong:
        return f"its subject {wrong[0]} is not the ledger's {want[wrong[0]]} (another version of the run)"
    if v.verifier_keyid != kid:
        return f"it names verifier key {v.verifier_keyid}, but key {kid} signed it"
    return None


def _missing(v: Vsa) -> str | None:
    """Why the statement lacks a value the report cites (None: it holds them all)."""
    for ptr in vsa.cited(v):
        try:
            lookup(v.statement.doc, ptr)
        except (LookupError, ValueError):
            return f"its statement has nothing at {ptr}"
    return None


# -- the checks -----------------------------------------------------------------------------


def signed(claim: Claim) -> Verdict:
    """Its signature, its statement and its subject (the verdict of :func:`open_claim`)."""
    return claim.opened


def backed(as_of: str) -> Check:
    """Backed by a verification record of the ledger, recorded by ``as_of`` (the report's build)."""

    def check(claim: Claim) -> Verdict:
        if claim.vsa is None or claim.keyid is None:
            return claim.opened
        why = vsa.backing_problem(claim.vsa, claim.log, claim.keyid, as_of)
        return Verdict("unbacked", why) if why else VALID

    return check


def role(kid: str | None, lab_key: str | None, trust: TrustList) -> Role | None:
    """Whose key ``kid`` is by the lab's word: its report key's (``lab_key``), or the list's role for it.
    An unsigned report (``lab_key`` None) vouches for nobody: no key answers for its list."""
    if lab_key is None:
        return None
    return verifiers.LAB if kid == lab_key else trust.role(kid)


def vouched(lab_key: str | None, trust: TrustList) -> Check:
    """A key the lab vouches for: its report key, or one in its verifiers list (``trust``)."""

    def check(claim: Claim) -> Verdict:
        if role(claim.keyid, lab_key, trust) is not None:
            return VALID
        return Verdict("unvouched", f"key {claim.keyid} is not in {verifiers.FILE}: the lab does not vouch for its "
                       "holder (a reader may, with `marin report verify --trust FILE`)" if lab_key else
                       f"the report is not signed, so nobody vouches for {verifiers.FILE}: sign the report "
                       "(`marin keygen`)")

    return check


def trusted_by(trust: TrustList, lab_key: str | None) -> Check:
    """A key in a reader's own list (``--trust``); the lab's report key is never independent, whatever it says."""

    def check(claim: Claim) -> Verdict:
        if claim.keyid in trust.by_key and claim.keyid != lab_key:
            return VALID
        return Verdict("unvouched", f"key {claim.keyid} is not in {trust.where} (or is the lab's own)")

    return check


def all_of(*checks: Check) -> Check:
    """A check that passes when every one of ``checks`` does: the first verdict that is not valid, in order."""

    def check(claim: Claim) -> Verdict:
        return next((v for c in checks if not (v := c(claim)).ok), VALID)

    return check


def lab_policy(lab_key: str | None, trust: TrustList, as_of: str) -> Check:
    """What the report counts: signed, backed by the ledger as of its build, vouched for by the lab."""
    return all_of(signed, backed(as_of), vouched(lab_key, trust))


# -- applying it ----------------------------------------------------------------------------


def claims(files: Mapping[str, bytes], runs: Mapping[str, RunLog]) -> list[Claim]:
    """Every VSA file filed under one of ``runs`` (by run id), opened, in path order; ``files``:
    project-relative path under verifications/ -> its bytes (the key files among them)."""
    keys = {p: d for p, d in files.items() if PurePosixPath(p).parent.name == vsa.KEYS}
    out: list[Claim] = []
    for p, data in sorted(files.items()):
        parts = PurePosixPath(p).parts
        if len(parts) == 3 and parts[1] != vsa.KEYS and parts[1] in runs:
            out.append(open_claim(p, data, keys, runs[parts[1]]))
    return out


@dataclass(frozen=True)
class Judged:
    """A claim with the policy's verdict, and whose key signed it by the lab's word."""

    claim: Claim
    verdict: Verdict
    role: Role | None

    @property
    def path(self) -> str:
        return self.claim.path


def judge(files: Mapping[str, bytes], runs: Mapping[str, RunLog], lab_key: str | None, trust: TrustList,
          as_of: str) -> list[Judged]:
    """Every VSA filed under one of ``runs``, judged by :func:`lab_policy`, in path order."""
    policy = lab_policy(lab_key, trust, as_of)
    return [Judged(c, policy(c), role(c.keyid, lab_key, trust)) for c in claims(files, runs)]


@dataclass(frozen=True)
class Recount:
    """The backed VSAs, counted by a reader's list: by keys it trusts (how many passed, the keys, their
    names) and by keys it does not."""

    trusted: int
    passed: int
    keys: int
    names: list[str]
    not_trusted: int


def recount(found: Sequence[Claim], trust: TrustList, lab_key: str | None, as_of: str) -> Recount:
    """``marin report verify --trust FILE``: the claims that are signed and backed, counted by the
    reader's own list (``trust``) instead of the lab's."""
    base, mine = all_of(signed, backed(as_of)), trusted_by(trust, lab_key)
    rows = [c for c in found if base(c).ok]
    kept = [(c.keyid, c.vsa.result) for c in rows if mine(c).ok and c.keyid is not None and c.vsa is not None]
    names = sorted({trust.by_key[k].name or k[:16] for k, _ in kept})
    return Recount(len(kept), sum(r == vsa.PASSED for _, r in kept), len({k for k, _ in kept}), names,
                   len(rows) - len(kept))
