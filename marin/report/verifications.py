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

What counts is decided by the trust policy (``marin.attest.policy``), never here: this module gathers
the files, renders the policy's verdicts and cites the counted VSAs' values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from marin import hashing, readers
from marin.attest import dsse, policy, verifiers, vsa
from marin.attest.models import Envelope
from marin.ledger.store import RunLog
from marin.report.facts import Context, Fact, Facts, ReportError, md_escape, resolve
from marin.report.page import Page
from marin.report.vouching import Files, Found, Vouching


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
    for j in policy.judge(datas(files), runs, lab_key, trust, as_of):
        found, kid, v = files[j.path], j.claim.keyid, j.verdict
        used[j.path] = found.to_dict()
        if kid and (kp := f"{vsa.DIR}/{vsa.KEYS}/{kid}.pub") in files:
            used[kp] = files[kp].to_dict()
        if v.ok and j.claim.vsa is not None:
            counted.append({**_cite(f, found, j.claim.log, j.claim.vsa), "role": j.role, "verifier": _who(kid, trust)})
        else:  # an unvouched VSA's result, for a reader who recounts with their own list
            result = {"result": j.claim.vsa.result} if v.status == "unvouched" and j.claim.vsa else {}
            not_counted.append({"file": j.path, "file_digest": found.digest, "status": v.status, "why": v.why,
                                "keyid": kid, **result})
    third = sorted({r["verifier"]["keyid"] for r in counted if r["role"] == verifiers.THIRD_PARTY})
    return {"counted": counted, "not_counted": not_counted,
            "verifiers": third, "listed": [v.to_dict() for v in trust.by_key.values()],
            "files": dict(sorted(used.items()))}


def datas(files: Files) -> dict[str, bytes]:
    """The files' bytes by path, as the trust policy reads them."""
    return {p: x.data for p, x in files.items()}


def _trust_list(files: Files) -> tuple[verifiers.TrustList, dict[str, Any]]:
    """The lab's verifiers list as the report read it (empty when there is none), and its file record."""
    found = files.get(verifiers.FILE)
    if found is None:
        return verifiers.TrustList(), {}
    try:
        return verifiers.parse(found.data, verifiers.FILE), {verifiers.FILE: found.to_dict()}
    except verifiers.TrustListError as e:
        raise ReportError(str(e)) from None


def _who(kid: str | None, trust: verifiers.TrustList) -> dict[str, str]:
    v = trust.get(kid)
    if v is None:  # the report key, not listed
        return {"keyid": kid or "", "name": "the lab (report signing key)", "contact": "", "published": ""}
    return {k: x for k, x in v.to_dict().items() if k != "role"}


def recount_line(vouching: Vouching, runs: dict[str, RunLog], trust_file: Path) -> str:
    """``marin report verify --trust FILE``: the (verified) report's VSAs recounted by the trust policy, with
    the reader's own list of keys instead of the lab's."""
    trust = verifiers.load_reader_list(trust_file)
    n = policy.recount(policy.claims(datas(vouching.files), runs), trust, vouching.lab_key, vouching.as_of)
    who = f" ({', '.join(n.names)})" if n.names else ""
    return (f"trust {trust_file}: {n.trusted} verification(s) by {n.keys} key(s) you trust{who}, "
            f"{n.passed} passed; {n.not_trusted} by keys you do not trust (the lab's own included)")


def _cite(f: Facts, found: Found, log: RunLog, v: vsa.Vsa) -> dict[str, Any]:
    """A counted VSA's row: each value the section shows, a fact citing its place in the signed statement."""

    def cite(label: str, pointer: str) -> str:
        return f.cite_vsa(f"{label} ({log.run_id})", found.path, found.digest, v.statement.doc, pointer).id

    row: dict[str, Any] = {"file": found.path, "run_id": log.run_id, "stage": log.stage,
                           **{k: cite(label, ptr) for k, (label, ptr) in vsa.CITED.items()}}
    if v.mode == "segments":
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
        return resolve(dsse.statement_of(Envelope.parse(data)).doc, src["pointer"])
    except (KeyError, IndexError, ValueError, TypeError, dsse.AttestationError) as e:
        raise ReportError(f"its source {src['vsa']} holds nothing at {src['pointer']} ({e})") from None


def recheck(section: dict[str, Any], files: Files, runs: dict[str, RunLog], lab_key: str | None,
            as_of: str) -> list[str]:
    """Each VSA the report listed, judged again from the recorded bytes, as of the report's build
    (``as_of``) with the key that signed it (``lab_key``): still counted (or not) as the report says."""
    said = {r["file"]: "valid" for r in section.get("counted", [])}
    said.update({r["file"]: r["status"] for r in section.get("not_counted", [])})
    trust, _ = _trust_list(files)
    now = {j.path: j for j in policy.judge(datas(files), runs, lab_key, trust, as_of)}
    problems: list[str] = []
    for p, status in sorted(said.items()):
        if p not in files:
            continue  # named by ``recorded``
        j = now.get(p)
        if j is None or j.verdict.status != status:
            got, why = (j.verdict.status, j.verdict.why) if j else ("not about a run of the report", "")
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
