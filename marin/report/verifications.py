"""The report's **Independent verification** section: the signed verification summaries (VSAs,
``marin verify --sign``, see ``marin.attest.vsa``) under verifications/ about the runs behind the model.

``marin report`` reads every file under verifications/ (VSAs and public keys) as an input of its
run, by digest, and builds the section from exactly those bytes. A VSA filed under a run of the
report's lineage is **counted** only when it is valid: its signature verifies with the public key
committed under its key id, its predicate is a SLSA verification summary, and its subject is that
run with the run's recorded ``run.finished`` and recipe digests. Its values become facts whose
source is the file (``{"vsa": path, "file_digest": ..., "pointer": ...}``, the pointer into the
signed statement). Invalid, unsigned and unverifiable VSAs are listed with the reason, never
counted. ``doc.independent_verification.files`` names every file the section read, with its
digest; ``marin report verify`` rereads exactly those (``recorded``), checks digests and validity,
and re-renders the section from them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from marin import hashing, readers
from marin.attest import dsse, verifiers, vsa
from marin.ledger.store import RunLog
from marin.report.facts import Context, Fact, Facts, ReportError, md_escape, resolve
from marin.report.page import Page
from marin.report.vouching import Files, Found


def current(root: Path) -> Files:
    """Every VSA and public key file under verifications/, and the lab's verifiers list, now."""
    return {p: Found(p, _read(root, p)) for p in vsa.files(root)}


def _read(root: Path, rel: str) -> bytes:
    """A file under verifications/, bounded by its kind (a VSA, a public key, the verifiers list)."""
    kind = "trust" if rel == verifiers.FILE else "key" if Path(rel).parent.name == vsa.KEYS else "vsa"
    try:
        return readers.read_bytes(Path(root) / rel, kind, ReportError)
    except FileNotFoundError:
        raise ReportError(f"{rel}: vanished while the report read verifications/; run it again") from None


def inputs(files: Files) -> list[dict[str, Any]]:
    """The files as input records of the report run."""
    return [{"name": f"verification:{p}", "path": p, **f.to_dict()} for p, f in sorted(files.items())]


def recorded(root: Path, section: dict[str, Any] | None) -> tuple[Files, list[str]]:
    """The files a report's section read, reread: a missing or changed one is a problem."""
    files: Files = {}
    problems: list[str] = []
    listed: dict[str, dict[str, Any]] = (section or {}).get("files") or {}
    for p, rec in sorted(listed.items()):
        path = Path(root) / p
        if not path.is_file():
            problems.append(f"{p}: listed by the report's Independent verification but missing; restore it "
                            f"(git checkout -- {p})")
            continue
        found = Found(p, _read(root, p))
        if found.digest != rec["digest"]:
            problems.append(f"{p}: changed since the report read it ({found.digest}, the report read "
                            f"{rec['digest']})")
            continue
        files[p] = found
    return files, problems


# -- the section ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """One VSA file filed under a run of the report, with what the section makes of it."""

    path: str
    found: Found
    checked: vsa.Checked
    status: str  # valid (counted), invalid, unsigned, unverifiable, unbacked, unvouched
    why: str
    role: str | None  # lab, third-party, or None (a key nobody vouches for)


def judge(files: Files, runs: dict[str, RunLog], lab_key: str | None, as_of: str) -> list[Judged]:
    """Every VSA filed under one of ``runs``, judged in path order: signature and subject
    (``vsa.check``), backed by a verification record made for its key, in time
    (``vsa.backing_problem``), and a key the lab vouches for: its report key, or one in
    verifiers.json. An unsigned report vouches for nobody: it has no key to answer for the list."""
    keys = {p: x.data for p, x in files.items() if Path(p).parent.name == vsa.KEYS}
    trust, _ = _trust_list(files)
    out: list[Judged] = []
    for p, found in sorted(files.items()):
        parts = Path(p).parts
        if len(parts) != 3 or parts[1] == vsa.KEYS or parts[1] not in runs:
            continue
        c = vsa.check(p, found.data, keys, runs)
        status, why = _status(c, runs[parts[1]], as_of)
        role = _role(c.keyid, lab_key, trust)
        if status == "valid" and role is None:
            status, why = "unvouched", (f"key {c.keyid} is not in {verifiers.FILE}: the lab does not vouch for "
                                        "its holder (a reader may, with `marin report verify --trust FILE`)"
                                        if lab_key else "the report is not signed, so nobody vouches for "
                                        f"{verifiers.FILE}: sign the report (`marin keygen`)")
        out.append(Judged(p, found, c, status, why, role))
    return out


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """The section's facts (ids), judged against ``c.vouching``; None without one (the cards alone)."""
    if c.vouching is None:
        return None
    return section(f, c.vouching.files, {log.run_id: log for log in c.lineage()}, c.vouching.lab_key,
                   c.vouching.as_of)


def section(f: Facts, files: Files, runs: dict[str, RunLog], lab_key: str | None, as_of: str) -> dict[str, Any]:
    """The VSAs filed under the ``runs`` (the lineage's, by run id), judged; counted ones cited as facts.
    ``lab_key``: the key id of the report's signing key (the lab's own, listed or not); ``as_of``: when
    the report was built (a VSA of a later verification does not count)."""
    trust, used = _trust_list(files)
    counted: list[dict[str, Any]] = []
    not_counted: list[dict[str, Any]] = []
    for j in judge(files, runs, lab_key, as_of):
        used[j.path] = j.found.to_dict()
        if j.checked.keyid and (kp := f"{vsa.DIR}/{vsa.KEYS}/{j.checked.keyid}.pub") in files:
            used[kp] = files[kp].to_dict()
        if j.status == "valid":
            counted.append({**_cite(f, j.found, runs[Path(j.path).parts[1]]), "role": j.role,
                            "verifier": _who(j.checked.keyid, trust)})
        else:
            not_counted.append({"file": j.path, "file_digest": j.found.digest, "status": j.status, "why": j.why,
                                "keyid": j.checked.keyid,
                                **({"result": _result(j.checked)} if j.status == "unvouched" else {})})
    third = sorted({r["verifier"]["keyid"] for r in counted if r["role"] == verifiers.THIRD_PARTY})
    return {"counted": counted, "not_counted": not_counted,
            "verifiers": third, "listed": [v.to_dict() for v in trust.by_key.values()],
            "files": dict(sorted(used.items()))}


def _trust_list(files: Files) -> tuple[verifiers.TrustList, dict[str, Any]]:
    """The lab's verifiers list as the report read it (empty when there is none), and its file record."""
    found = files.get(verifiers.FILE)
    if found is None:
        return verifiers.TrustList(), {}
    try:
        return verifiers.parse(found.data, verifiers.FILE), {verifiers.FILE: found.to_dict()}
    except verifiers.TrustListError as e:
        raise ReportError(str(e)) from None


def _role(kid: str | None, lab_key: str | None, trust: verifiers.TrustList) -> str | None:
    if lab_key is None:  # unsigned: no one answers for the list
        return None
    return verifiers.LAB if kid == lab_key else trust.role(kid)


def _who(kid: str | None, trust: verifiers.TrustList) -> dict[str, str]:
    v = trust.get(kid)
    if v is None:  # the report key, not listed
        return {"keyid": kid or "", "name": "the lab (report signing key)", "contact": "", "published": ""}
    return {k: x for k, x in v.to_dict().items() if k != "role"}


def _result(c: vsa.Checked) -> str:
    return str((c.statement or {}).get("predicate", {}).get("verificationResult"))


def recount(section: dict[str, Any], facts: dict[str, Any], trust: verifiers.TrustList,
            lab_key: str | None) -> dict[str, Any]:
    """``marin report verify --trust FILE``: the report's backed VSAs counted by the reader's own list
    (the lab's report key is never independent, whatever the list says)."""
    rows = [(r["verifier"]["keyid"], facts[r["summary"]]["value"]) for r in section.get("counted", [])]
    rows += [(r["keyid"], r["result"]) for r in section.get("not_counted", []) if r["status"] == "unvouched"]
    trusted = [(k, res) for k, res in rows if k in trust.by_key and k != lab_key]
    names = sorted({trust.by_key[k].name or k[:16] for k, _ in trusted})
    return {"trusted": len(trusted), "passed": sum(res == vsa.PASSED for _, res in trusted), "names": names,
            "keys": len({k for k, _ in trusted}), "not_trusted": len(rows) - len(trusted)}


_CITED = {  # label -> pointer into the signed statement
    "keyid": ("verifier key id", "/predicate/marin/verifier/keyid"),
    "cpu": ("verifier CPU", "/predicate/marin/verifier/cpu_model"),
    "features": ("verifier CPU features", "/predicate/marin/verifier/cpu_features"),
    "determinism": ("verifier determinism class digest", "/predicate/marin/verifier/determinism_digest"),
    "mode": ("verification mode", "/predicate/marin/mode"),
    "result": ("verification result", "/predicate/marin/result"),
    "summary": ("verification summary result", "/predicate/verificationResult"),
    "when": ("time verified", "/predicate/timeVerified"),
}


def _pointers(stmt: dict[str, Any]) -> list[str]:
    segments = stmt["predicate"]["marin"].get("mode") == "segments"
    return [ptr for _, ptr in _CITED.values()] + ([f"/predicate/marin/segments/{k}" for k in "kn"] if segments else [])


def _status(c: vsa.Checked, log: RunLog | None, as_of: str) -> tuple[str, str]:
    """A VSA's status and why, for the section: a valid one must also hold every value the section
    cites, and be backed by a verification record of the ledger (``vsa.backing_problem``)."""
    gap = _missing(c.statement) if c.valid else None
    if gap:
        return "invalid", f"its statement has nothing at {gap}"
    if c.valid and log is not None and c.keyid is not None and c.statement is not None:
        why = vsa.backing_problem(c.statement, log, c.keyid, as_of)
        if why:
            return "unbacked", why
    return c.status, c.why


def _missing(stmt: dict[str, Any] | None) -> str | None:
    """The first pointer the section cites that the (signed, valid) statement lacks; None: none."""
    for ptr in _pointers(stmt or {}):
        try:
            resolve(stmt, ptr)
        except (KeyError, IndexError, ValueError, TypeError):
            return ptr
    return None


def _cite(f: Facts, found: Found, log: RunLog) -> dict[str, Any]:
    stmt = dsse.statement_of(json.loads(found.data))

    def cite(label: str, pointer: str) -> str:
        return f.cite_vsa(f"{label} ({log.run_id})", found.path, found.digest, stmt, pointer).id

    row: dict[str, Any] = {"file": found.path, "run_id": log.run_id, "stage": log.stage,
           **{k: cite(label, ptr) for k, (label, ptr) in _CITED.items()}}
    if stmt["predicate"]["marin"]["mode"] == "segments":
        row["segments"] = {k: cite(f"segments {k}", f"/predicate/marin/segments/{k}") for k in "kn"}
    return row


def value_at(root: Path, src: dict[str, Any]) -> Any:
    """A VSA fact's value read again at its source; a ReportError when the file changed or is gone."""
    path = Path(root) / src["vsa"]
    if not path.is_file():
        raise ReportError(f"its source {src['vsa']} is missing")
    data = _read(root, src["vsa"])
    if (got := hashing.bytes_digest(data)) != src["file_digest"]:
        raise ReportError(f"its source {src['vsa']} hashes to {got}, the report read {src['file_digest']}")
    try:
        return resolve(dsse.statement_of(json.loads(data)), src["pointer"])
    except (KeyError, IndexError, ValueError, TypeError, dsse.AttestationError) as e:
        raise ReportError(f"its source {src['vsa']} holds nothing at {src['pointer']} ({e})") from None


def recheck(section: dict[str, Any], files: Files, runs: dict[str, RunLog], lab_key: str | None,
            as_of: str) -> list[str]:
    """Each VSA the report listed, judged again from the recorded bytes, as of the report's build
    (``as_of``) with the key that signed it (``lab_key``): still counted (or not) as the report says."""
    said = {r["file"]: "valid" for r in section.get("counted", [])}
    said.update({r["file"]: r["status"] for r in section.get("not_counted", [])})
    now = {j.path: j for j in judge(files, runs, lab_key, as_of)}
    problems: list[str] = []
    for p, status in sorted(said.items()):
        if p not in files:
            continue  # named by ``recorded``
        j = now.get(p)
        if j is None or j.status != status:
            got, why = (j.status, j.why) if j else ("not about a run of the report", "")
            problems.append(f"{p}: the report lists it as {status}, it is now {got}" + (f" ({why})" if why else ""))
    return problems


# -- report.md ------------------------------------------------------------------------------


WHAT_IT_PROVES = (
    "What a VSA proves: that the holder of its key signed exactly what a `marin verify` run recorded in this "
    "ledger (the result, the verifier's CPU, the time), about the run's recorded digests. What it cannot prove: "
    "that the key's holder is anyone but the lab. Anyone, a dishonest lab included, can make any number of keys "
    "(sybils) and list them. So a third-party VSA counts here only when its key is in `verifications/verifiers.json`, "
    "where the lab vouches, under this report's signature, for each verifier's name, contact and published key; "
    "a reader who does not take the lab's word recounts with their own list: `marin report verify --trust FILE`. "
    "Times are the recording machine's UTC clock, not a trusted timestamp (`marin ledger check` flags a run "
    "that starts before the one before it ended, beyond `ledger.clock_skew_s`, or lies in the future).")


def lines(p: Page) -> list[str]:
    """The Independent verification section of report.md."""
    v, items, sec = p.v, p.facts, p.doc["independent_verification"]
    out = ["## Independent verification", "",
           "Signed verification summaries (SLSA VSA v1 in-toto statements in DSSE envelopes, written by "
           "`marin verify --sign`) filed under `verifications/<run id>/` for the runs of this report. One counts "
           "only when its ed25519 signature verifies with the public key committed as "
           "`verifications/keys/<key id>.pub` (the key id is the sha256 of the key, so a substituted key cannot "
           "match), its subject is that run with its recorded `run.finished` and recipe digests, it is exactly "
           "the summary of a verification record of that run in the ledger, made by `marin verify --sign` for that "
           "very key, verified "
           "between the run's end and this report's build, and its key is the lab's "
           "or one the lab vouches for.", "", WHAT_IT_PROVES, ""]
    counted = sec["counted"]
    third = [r for r in counted if r["role"] == verifiers.THIRD_PARTY]
    lab = [r for r in counted if r["role"] == verifiers.LAB]
    passed = sum(items[r["summary"]].value == vsa.PASSED for r in third)
    lab_passed = sum(items[r["summary"]].value == vsa.PASSED for r in lab)
    out += [f"**{len(third)} third-party verification(s) by {len(sec['verifiers'])} verifier(s) the lab vouches "
            f"for**, {passed} passed; {len(lab)} by the lab itself (not independent), {lab_passed} passed; "
            f"{len(sec['not_counted'])} file(s) not counted.", ""]
    if counted:
        out += _table(["stage", "run", "verifier", "role", "verifier key", "CPU", "CPU features",
                       "determinism class", "mode", "result", "summary", "verified at"],
                      [[r["stage"], f"`{r['run_id']}`", md_escape(r["verifier"]["name"]), r["role"], v(r["keyid"]),
                        v(r["cpu"]), _features(items[r["features"]]), v(r["determinism"]),
                        _mode(v, r), v(r["result"]), v(r["summary"]), v(r["when"])] for r in counted])
    if sec["listed"]:
        out += [f"Verifiers the lab vouches for (`{verifiers.FILE}`):", ""]
        out += _table(["name", "role", "contact", "key published at", "key id"],
                      [[md_escape(x["name"]), x["role"], md_escape(x["contact"]), md_escape(x["published"]),
                        f"`{x['keyid']}`"] for x in sec["listed"]])
    if sec["not_counted"]:
        out += ["Not counted:", ""]
        out += _table(["file", "status", "why"], [[f"`{r['file']}`", r["status"], md_escape(r["why"])]
                                                  for r in sec["not_counted"]])
    if not counted and not sec["not_counted"]:
        out += ["None yet: a verifier runs `marin verify --sign --key THEIR_KEY RUN`; the lab lists their key in "
                f"`{verifiers.FILE}`, commits `verifications/`, then runs `marin report`.", ""]
    return out


def _features(fact: Fact) -> str:
    """The CPU features as their count, linked to the fact that lists them."""
    value: Any = fact.value
    n = len(cast(list[Any], value)) if isinstance(value, list) else md_escape(fact.text)
    return f"[{n} features](#{fact.id})"


def _mode(v: Callable[[str | None], str], r: dict[str, Any]) -> str:
    seg = r.get("segments")
    return v(r["mode"]) if not seg else f"{v(r['mode'])} {v(seg['k'])} of {v(seg['n'])}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows),
            ""]
