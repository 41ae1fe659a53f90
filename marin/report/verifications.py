"""The report's **Independent verification** section: the signed verification summaries (VSAs,
``marin verify --sign``, see ``marin.verify.vsa``) under verifications/ about the runs behind the model.

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
from typing import Any

from marin import hashing
from marin.ledger.store import RunLog
from marin.report import attest
from marin.report.facts import Fact, Facts, ReportError, md_escape, resolve
from marin.verify import vsa


@dataclass(frozen=True)
class Found:
    """One file under verifications/ as the report read it."""

    path: str  # project-relative
    data: bytes

    @property
    def digest(self) -> str:
        return hashing.bytes_digest(self.data)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": len(self.data)}


Files = dict[str, Found]


def current(root: Path) -> Files:
    """Every VSA and public key file under verifications/ now."""
    return {p: Found(p, (Path(root) / p).read_bytes()) for p in vsa.files(root)}


def inputs(files: Files) -> list[dict[str, Any]]:
    """The files as input records of the report run."""
    return [{"name": f"verification:{p}", "path": p, **f.to_dict()} for p, f in sorted(files.items())]


def recorded(root: Path, section: dict[str, Any] | None) -> tuple[Files, list[str]]:
    """The files a report's section read, reread: a missing or changed one is a problem."""
    files, problems = {}, []
    for p, rec in sorted(((section or {}).get("files") or {}).items()):
        path = Path(root) / p
        if not path.is_file():
            problems.append(f"{p}: listed by the report's Independent verification but missing; restore it "
                            f"(git checkout -- {p})")
            continue
        found = Found(p, path.read_bytes())
        if found.digest != rec["digest"]:
            problems.append(f"{p}: changed since the report read it ({found.digest}, the report read "
                            f"{rec['digest']})")
            continue
        files[p] = found
    return files, problems


# -- the section ----------------------------------------------------------------------------


def section(f: Facts, files: Files, runs: dict[str, RunLog]) -> dict[str, Any]:
    """The VSAs filed under the ``runs`` (the lineage's, by run id), checked; valid ones cited as facts."""
    keys = {p: x.data for p, x in files.items() if Path(p).parent.name == vsa.KEYS}
    counted, not_counted, used = [], [], {}
    for p, found in sorted(files.items()):
        parts = Path(p).parts
        if len(parts) != 3 or parts[1] == vsa.KEYS or parts[1] not in runs:
            continue
        c = vsa.check(p, found.data, keys, runs)
        used[p] = found.to_dict()
        if c.keyid and (kp := f"{vsa.DIR}/{vsa.KEYS}/{c.keyid}.pub") in keys:
            used[kp] = files[kp].to_dict()
        status, why = _status(c)
        if status == "valid":
            counted.append(_cite(f, found, runs[parts[1]]))
        else:
            not_counted.append({"file": p, "file_digest": found.digest, "status": status, "why": why,
                                "keyid": c.keyid})
    verifiers = sorted({f.items[row["keyid"]].value for row in counted})
    return {"counted": counted, "not_counted": not_counted, "verifiers": verifiers,
            "files": dict(sorted(used.items()))}


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


def _status(c: vsa.Checked) -> tuple[str, str]:
    """A VSA's status and why, for the section: a valid one must also hold every value the section cites."""
    gap = _missing(c.statement) if c.valid else None
    return ("invalid", f"its statement has nothing at {gap}") if gap else (c.status, c.why)


def _missing(stmt: dict[str, Any] | None) -> str | None:
    """The first pointer the section cites that the (signed, valid) statement lacks; None: none."""
    for ptr in _pointers(stmt or {}):
        try:
            resolve(stmt, ptr)
        except (KeyError, IndexError, ValueError, TypeError):
            return ptr
    return None


def _cite(f: Facts, found: Found, log: RunLog) -> dict[str, Any]:
    stmt = attest.statement_of(json.loads(found.data))

    def cite(label: str, pointer: str) -> str:
        return f.cite_vsa(f"{label} ({log.run_id})", found.path, found.digest, stmt, pointer).id

    row = {"file": found.path, "run_id": log.run_id, "stage": log.started.body["stage"],
           **{k: cite(label, ptr) for k, (label, ptr) in _CITED.items()}}
    if stmt["predicate"]["marin"]["mode"] == "segments":
        row["segments"] = {k: cite(f"segments {k}", f"/predicate/marin/segments/{k}") for k in "kn"}
    return row


def value_at(root: Path, src: dict[str, Any]) -> Any:
    """A VSA fact's value read again at its source; a ReportError when the file changed or is gone."""
    path = Path(root) / src["vsa"]
    if not path.is_file():
        raise ReportError(f"its source {src['vsa']} is missing")
    data = path.read_bytes()
    if (got := hashing.bytes_digest(data)) != src["file_digest"]:
        raise ReportError(f"its source {src['vsa']} hashes to {got}, the report read {src['file_digest']}")
    try:
        return resolve(attest.statement_of(json.loads(data)), src["pointer"])
    except (KeyError, IndexError, ValueError, TypeError, attest.AttestationError) as e:
        raise ReportError(f"its source {src['vsa']} holds nothing at {src['pointer']} ({e})") from None


def recheck(section: dict[str, Any], files: Files, runs: dict[str, RunLog]) -> list[str]:
    """Each VSA the report listed, checked again from the recorded bytes: still as valid or not as the report says."""
    keys = {p: x.data for p, x in files.items() if Path(p).parent.name == vsa.KEYS}
    said = {r["file"]: "valid" for r in section.get("counted", [])}
    said.update({r["file"]: r["status"] for r in section.get("not_counted", [])})
    problems = []
    for p, status in sorted(said.items()):
        if p not in files:
            continue  # named by ``recorded``
        now, why = _status(vsa.check(p, files[p].data, keys, runs))
        if now != status:
            problems.append(f"{p}: the report lists it as {status}, it is now {now}" + (f" ({why})" if why else ""))
    return problems


# -- report.md ------------------------------------------------------------------------------


def lines(v: Callable[[str | None], str], doc: dict[str, Any], items: dict[str, Fact]) -> list[str]:
    """The Independent verification section of report.md (``items``: the facts by id)."""
    sec = doc["independent_verification"]
    out = ["## Independent verification", "",
           "Signed verification summaries (SLSA VSA v1 in-toto statements in DSSE envelopes, written by "
           "`marin verify --sign`) filed under `verifications/<run id>/` for the runs of this report. One counts "
           "only when its ed25519 signature verifies with the public key committed as "
           "`verifications/keys/<key id>.pub` (the key id is the sha256 of the key, so a substituted key cannot "
           "match), its predicate is a verification summary, and its subject is that run with its recorded "
           "`run.finished` and recipe digests.", ""]
    counted, verifiers = sec["counted"], sec["verifiers"]
    passed = sum(items[r["summary"]].value == vsa.PASSED for r in counted)
    out += [f"**{len(counted)} verification(s) by {len(verifiers)} verifier key(s)**, {passed} passed; "
            f"{len(sec['not_counted'])} file(s) not counted.", ""]
    if counted:
        out += _table(["stage", "run", "verifier key", "CPU", "CPU features", "determinism class", "mode",
                       "result", "summary", "verified at"],
                      [[r["stage"], f"`{r['run_id']}`", v(r["keyid"]), v(r["cpu"]),
                        _features(items[r["features"]]), v(r["determinism"]),
                        _mode(v, r), v(r["result"]), v(r["summary"]), v(r["when"])] for r in counted])
    if sec["not_counted"]:
        out += ["Not counted:", ""]
        out += _table(["file", "status", "why"], [[f"`{r['file']}`", r["status"], md_escape(r["why"])]
                                                  for r in sec["not_counted"]])
    if not counted and not sec["not_counted"]:
        out += ["None yet: `marin verify --sign RUN` writes one; commit `verifications/`, then run `marin report`.",
                ""]
    return out


def _features(fact: Fact) -> str:
    """The CPU features as their count, linked to the fact that lists them."""
    n = len(fact.value) if isinstance(fact.value, list) else md_escape(fact.text)
    return f"[{n} features](#{fact.id})"


def _mode(v: Callable[[str | None], str], r: dict[str, Any]) -> str:
    seg = r.get("segments")
    return v(r["mode"]) if not seg else f"{v(r['mode'])} {v(seg['k'])} of {v(seg['n'])}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows),
            ""]
