"""``marin report verify``: a report checked against its statement, the ledger and its references.

Numbered steps, each with its own messages:

1. signature: the DSSE envelope verifies with the public key; an envelope without signatures
   is "not signed", a problem only with ``--require-signature``;
2. files: every file against its digest in the statement (none added, none missing);
3. ledger: the runs behind the report are intact, and every run of the snapshot the report was
   built from (ledger_head.json, its root signed) is still there, unchanged or only extended; runs
   added since (report runs aside) and records appended since make the report stale, not wrong: it is
   re-rendered as of its snapshot and the verdict says what a rebuild would add;
4. references: the reference files report.json names, reread, still have their digests; the files
   under verifications/ the Independent verification section read, reread: their digests, and
   each VSA still as valid (or not) as the report lists it;
5. facts: each fact looked up at exactly its source (that run file, that seq, that record
   digest, that pointer), or recomputed from its inputs; a source that is gone is named, never
   resolved against another record (a VSA fact: that file, that digest, that pointer into its statement);
6. every file re-rendered from the ledger, byte for byte, and the model's signed tensor digest.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import hashing, readers, stages
from marin.attest import dsse, keyring
from marin.attest.models import Envelope, Statement
from marin.config import clock_skew_s
from marin.errors import LedgerError, MarinError
from marin.ledger import clock
from marin.ledger.asof import ledger_as_of
from marin.ledger.check import check_run
from marin.ledger.head import Head, load_snapshot, locate, since
from marin.ledger.query import Ledger
from marin.ledger.records import Record
from marin.ledger.store import NoSuchRun, RunLog, load_run
from marin.paths import ledger_dir
from marin.report import build, reference, verifications
from marin.report.facts import FORMULAS, ReportError, fmt, resolve
from marin.report.reference import References
from marin.report.vouching import Vouching


@dataclass
class ReportCheck:
    directory: Path
    problems: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    signature: str = "signature not checked"
    signer: str | None = None  # the key id the signature verified with (None: not signed)
    report: dict[str, Any] | None = None  # report.json as verified
    vouching: Vouching | None = None  # what its VSAs were judged against, and the runs they are about (--trust)
    runs: dict[str, RunLog] = field(default_factory=dict)
    newer: list[str] = field(default_factory=list)  # runs added since the snapshot (report runs aside)
    extended: list[str] = field(default_factory=list)  # snapshot runs with records appended since

    @property
    def ok(self) -> bool:
        return not self.problems

    def stale(self) -> str | None:
        """One line saying what the ledger holds beyond the report's snapshot, or None when nothing."""
        if not self.newer and not self.extended:
            return None
        parts = [f"{len(self.newer)} newer run{'s' * (len(self.newer) != 1)} ({_few(self.newer)})"] if self.newer \
            else []
        parts += [f"records added since to {len(self.extended)} of its runs ({_few(self.extended)})"] \
            if self.extended else []
        return f"stale: {', '.join(parts)}; `marin report` rebuilds it"


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def verify(root: Path, directory: Path, public_key: Path | None = None,
           require_signature: bool = False, release: bool = False) -> ReportCheck:
    """Steps 1-6 (see the module docstring) for the report in ``directory``; ``release``: also refuse
    params.yaml's placeholders in what the report says about its makers."""
    from marin.report.placeholders import placeholders

    v = ReportCheck(directory)
    envelope, old = _load(directory)
    if release and old is not None:
        v.problems += [f"report.json: {p}" for p in placeholders(old.get("meta") or {})]
    stmt = _signature(root, envelope, public_key, require_signature, v)  # 1
    try:
        signed = stmt.digests()
    except KeyError as e:
        raise ReportError(f"{build.ENVELOPE}: the statement's subjects are not name and sha256 pairs ({e!r}); "
                          "rebuild the report with `marin report`") from None
    _files(directory, signed, v)  # 2
    if old is None:
        v.problems.append("report.json: missing; cannot re-derive the report")
        return v
    v.report = old
    try:
        with Ledger(root, sources=stages.SOURCE_STAGES) as ledger:  # one index for the whole verification
            _rederive(root, ledger, directory, stmt, signed, old, v)
    except (KeyError, TypeError, AttributeError) as e:  # report.json is not what marin report writes
        v.problems.append(f"report.json: not a marin report ({type(e).__name__}: {e}); rebuild it with `marin report`")
    return v


def report_snapshot(root: Path, directory: Path, public_key: Path | None = None) -> tuple[Head, str]:
    """The ledger snapshot a report was built from, for ``marin ledger check --since REPORT``,
    believed only as far as the report's statement vouches for it: the envelope's signature
    checked where it is signed, ledger_head.json one of the statement's subjects with its digest,
    and its root the statement's marin:ledger digest. Returns the snapshot and "signature ok" or
    "not signed"; a ledger_head.json the statement does not vouch for is a ReportError."""
    envelope, _ = _load(directory)
    v = ReportCheck(directory)
    stmt = _signature(root, envelope, public_key, False, v)
    path = directory / build.HEAD_FILE
    try:
        want = stmt.digests().get(build.HEAD_FILE)
    except KeyError as e:
        raise ReportError(f"{directory / build.ENVELOPE}: the statement's subjects are not name and sha256 pairs "
                          f"({e!r}); use the report as it was published") from None
    got = hashing.file_digest(path) if path.is_file() else None
    when = "signed" if v.signature == "signature ok" else "written (unsigned)"
    if want is None or got != want:
        why = "is not a subject of its statement" if want is None else (
            "is missing" if got is None else f"changed since it was {when} ({got}, the statement has {want})")
        raise ReportError(f"{path}: {why}, so the snapshot cannot be trusted; use the report as it was published "
                          "(`marin report verify` checks the whole report)")
    snap = load_snapshot(path)
    ledger = dsse.dependency_digest(stmt, "marin:ledger")
    if ledger is None or f"sha256:{ledger}" != snap.root:
        raise ReportError(f"{path}: its root {snap.root} is not the statement's marin:ledger digest sha256:{ledger}")
    return snap, v.signature


def _rederive(root: Path, ledger: Ledger, directory: Path, stmt: Statement, signed: dict[str, str],
              old: dict[str, Any], v: ReportCheck) -> None:
    """Steps 3-6."""
    _ledger(ledger, directory, stmt, old, v)  # 3
    as_of = _as_of(ledger, directory, v)
    with contextlib.suppress(LedgerError):  # a snapshot that cannot be read is named by step 3
        # re-rendered from the ledger as the report's snapshot holds it: later runs change nothing here
        ledger = ledger_as_of(root, ledger.index.whole, load_snapshot(directory / build.HEAD_FILE), ledger.sources)
    refs, ref_problems = reference.recorded(root, old.get("references"))  # 4
    v.problems.extend(ref_problems)
    listed: dict[str, Any] = old["doc"].get("independent_verification") or {}
    vsas, vsa_problems = verifications.recorded(root, listed)  # 4b: the VSA files, digests and validity
    runs = {r["run_id"]: ledger.runs[r["run_id"]] for r in old["doc"]["lineage"] if r["run_id"] in ledger.runs}
    vsa_problems += verifications.recheck(listed, vsas, runs, v.signer, as_of)
    v.problems.extend(vsa_problems)
    v.checked["verifications"] = len(listed.get("counted", []))
    values, fact_problems = rederive(root, old["facts"])  # 5
    v.problems.extend(fact_problems)
    v.checked["facts"] = len(old["facts"])
    v.vouching, v.runs = Vouching(vsas, v.signer, as_of), runs
    if not ref_problems and not vsa_problems:  # 6
        _rerender(ledger, directory, old, refs, v.vouching, v)
    model_subject = next((d for n, d in signed.items() if n.startswith("model:")), None)
    tensor = values.get(old["doc"]["model"]["tensor_digest"])
    if tensor is not None and model_subject != tensor:
        v.problems.append(f"model: the signed tensor digest {model_subject} is not the ledger's {tensor}")


def _load(directory: Path) -> tuple[object, dict[str, Any] | None]:
    env_path, report_json = directory / build.ENVELOPE, directory / "report.json"
    if not env_path.is_file():
        raise ReportError(f"{env_path}: missing; is {directory} a report directory (marin report)?")
    try:
        old = json.loads(readers.read_bytes(report_json, "report", ReportError)) if report_json.is_file() else None
        return json.loads(readers.read_bytes(env_path, "report", ReportError)), old
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{directory}: report.json or {build.ENVELOPE} is not valid JSON ({e}): changed after "
                          "it was written") from None


def _signature(root: Path, raw: object, public_key: Path | None, require: bool, v: ReportCheck) -> Statement:
    """Step 1: the statement, its signature checked; or read unsigned and said so."""
    envelope = Envelope.from_json(raw)
    if not envelope.signed:
        v.signature = "not signed"
        if require:
            v.problems.append(f"{build.ENVELOPE}: not signed (no signatures), and --require-signature was given: "
                              "build the report where the signing key is (`marin keygen`, then `marin report`)")
        return dsse.read_unsigned(envelope)
    if public_key is None:  # the public half of the configured signing key
        from marin import config

        private = keyring.signing_key(root, config.load(root / "params.yaml").report)
        public_key = private.with_name(private.name + ".pub")
    if not public_key.is_file():
        kids = ", ".join(sorted({str(s.keyid) for s in envelope.signatures}))
        raise ReportError(f"{build.ENVELOPE}: signed by key {kids}, but there is no public key at {public_key}: "
                          "give the signer's public key with --key PUB")
    stmt = dsse.verify(envelope, public_key)
    v.signature, v.signer = "signature ok", keyring.keyid(keyring.load_public_key(public_key))
    return stmt


UNKNOWN_BUILD = "9999-12-31T23:59:59Z"  # no report run recorded the envelope (a problem already)


def _as_of(ledger: Ledger, directory: Path, v: ReportCheck) -> str:
    """Step 3b: when the report was built, which its VSAs are judged as of: the start of the report run
    that recorded this very envelope (none: a problem, and nothing counts as of it)."""
    digest = hashing.file_digest(directory / build.ENVELOPE)
    starts = sorted({ledger.runs[r].start.time for r, _, role, b in ledger.index.entities(digest=digest)
                     if role == "output" and str(b.get("path", "")).endswith(build.ENVELOPE)})
    if not starts:
        v.problems.append(f"{build.ENVELOPE}: no report run in the ledger recorded it, so when the report was built "
                          "is unknown; rebuild it with `marin report`")
        return UNKNOWN_BUILD  # the problem stands; the other steps still run and name what they find
    return starts[0]


def _files(directory: Path, signed: dict[str, str], v: ReportCheck) -> None:
    """Step 2: every file on disk is a subject of the statement, with its digest."""
    on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {build.ENVELOPE}
    when = "signed" if v.signature == "signature ok" else "written (unsigned)"
    for name in sorted(on_disk | {n for n in signed if not n.startswith("model:")}):
        if name not in signed:
            v.problems.append(f"{name}: not covered by the provenance statement (file added)")
        elif name not in on_disk:
            v.problems.append(f"{name}: in the provenance statement but missing")
        elif (got := hashing.file_digest(directory / name)) != signed[name]:
            v.problems.append(f"{name}: changed since it was {when} ({got}, the statement has {signed[name]})")
    v.checked["files"] = len(on_disk)


def _ledger(ledger: Ledger, directory: Path, stmt: Statement, old: dict[str, Any], v: ReportCheck) -> None:
    """Step 3: the lineage's runs are intact; the snapshot's runs are all still there."""
    root = ledger.root
    for r in old["doc"]["lineage"]:
        log = ledger.runs.get(r["run_id"])
        if log is None:
            v.problems.append(f"ledger: run {r['run_id']} behind the report is not in the ledger "
                              f"({r['run_id']}.jsonl deleted?)")
            continue
        v.problems.extend(f"ledger: {p}" for p in check_run(log))
    try:
        snap = load_snapshot(directory / build.HEAD_FILE)
    except LedgerError as e:
        v.problems.append(f"{build.HEAD_FILE}: {e}")
        return
    signed = dsse.dependency_digest(stmt, "marin:ledger")
    if signed is None or f"sha256:{signed}" != snap.root:
        v.problems.append(f"{build.HEAD_FILE}: its root {snap.root} is not the statement's marin:ledger digest "
                          f"sha256:{signed}")
    found = locate(ledger_dir(root), snap)
    v.problems.extend(f"ledger: {where}: {what}" for where, what in since(snap, found))
    _staleness(ledger, snap, found, v)
    logs = [ledger.runs[r["run_id"]] for r in old["doc"]["lineage"] if r["run_id"] in ledger.runs]
    v.problems.extend(f"ledger: {p}" for p in clock.problems_for(logs, clock_skew_s(root), snapshot=snap))


def _staleness(ledger: Ledger, snap: Head, found: dict[str, tuple[int | None, str | None]], v: ReportCheck) -> None:
    """Step 3c: what the ledger holds beyond the snapshot (one index query; the snapshot's files were
    read by ``locate`` already). Report runs are left out: a report is never about a report run."""
    held = {leaf.run_id: leaf.seq for leaf in snap.leaves}
    v.newer = [r.run_id for r in ledger.index.runs() if r.run_id not in held and r.stage != "report"]
    v.extended = sorted(rid for rid, (last, _) in found.items() if last is not None and last > held[rid])


def _rerender(ledger: Ledger, directory: Path, old: dict[str, Any], refs: References, vouching: Vouching,
              v: ReportCheck) -> None:
    """Step 6: every re-derivable file rebuilt from the ledger and compared byte for byte."""
    try:
        files, _ = build.render_files(ledger, {k: old["meta"][k] for k in old["meta"] if k != "date"}, refs, vouching)
    except (MarinError, KeyError, TypeError) as e:
        v.problems.append(f"ledger: the report cannot be re-derived: {e}")
        return
    for name, data in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            continue
        try:
            got = readers.read_bytes(path, "report", ReportError)
        except ReportError as e:
            v.problems.append(str(e))
            continue
        if got != data:
            v.problems.append(f"{name}: {_first_line_diff(got, data)}")


# -- step 5: facts at their sources ---------------------------------------------------------


class _Gone(Exception):
    """A fact's source cannot be found or read (the message says which and why)."""


def rederive(root: Path, facts: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Each fact's value read again at exactly its source, or recomputed from its inputs' values:
    (the values found by fact id, the problems)."""
    runs: dict[str, dict[int, Record] | None] = {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for fid, fact in sorted(facts.items(), key=lambda kv: (len(kv[0]), kv[0])):  # inputs come before
        src, label = fact["source"], f"fact {fid} ({fact['label']})"
        try:
            value, note = _derived(values, src) if "formula" in src else _vsa_value(root, src) if "vsa" in src \
                else _at_source(root, runs, src)
        except _Gone as e:
            problems.append(f"{label}: {e}")
            continue
        values[fid] = value
        if value != fact["value"]:
            where = f"{src['run_id']} seq {src['seq']}" if "run_id" in src else f"{src['formula']} of its inputs"
            problems.append(f"{label}: the report says {fact['text']}, the ledger ({where}) says {fmt(value)}"
                            + (f"; {note}" if note else ""))
        elif note:
            problems.append(f"{label}: {note}; the value is unchanged")
    return values, problems


def _vsa_value(root: Path, src: dict[str, Any]) -> tuple[Any, None]:
    try:
        return verifications.value_at(root, src), None
    except ReportError as e:
        raise _Gone(str(e)) from None


def _records(root: Path, runs: dict[str, dict[int, Record] | None], run_id: str) -> dict[int, Record] | None:
    if run_id not in runs:
        try:
            runs[run_id] = {r.seq: r for r in load_run(root, run_id).records}
        except NoSuchRun:  # named by the caller: the fact's source is gone
            runs[run_id] = None
    return runs[run_id]


def _at_source(root: Path, runs: dict[str, dict[int, Record] | None], src: dict[str, Any]) -> tuple[Any, str | None]:
    """The value at (run file, seq, pointer), and a note when the record is not the one cited."""
    run_id, seq = str(src["run_id"]), src["seq"]
    where = f"its source {run_id}.jsonl seq {seq}"
    recs = _records(root, runs, run_id)
    if recs is None:
        raise _Gone(f"{where} is gone (run file deleted?)")
    rec = recs.get(seq)
    if rec is None:
        last = max(recs, default=None)
        raise _Gone(f"{where} is gone (the file's records end at seq {last}: removed or unreadable; "
                    "see `marin ledger check`)")
    note = None if rec.digest == src["record"] else (
        f"its source record {run_id} seq {seq} was rewritten: it is now {rec.digest}, the report cites {src['record']}")
    doc: Any = rec.to_dict()
    if "file" in src:
        doc = _recorded_file(root, rec, src, where)
    try:
        return resolve(doc, src["pointer"]), note
    except (KeyError, IndexError, ValueError, TypeError):
        raise _Gone(f"{where} holds nothing at {src['pointer']}") from None


def _recorded_file(root: Path, rec: Record, src: dict[str, Any], where: str) -> Any:
    """The recorded output file a fact points into, checked against the digest its record holds."""
    if rec.kind != "output":
        raise _Gone(f"{where} no longer records {src['file']} as {src['file_digest']}")
    out = rec.body_as("output")
    if out["path"] != src["file"] or out["digest"] != src["file_digest"]:
        raise _Gone(f"{where} no longer records {src['file']} as {src['file_digest']}")
    path = Path(root) / out["path"]
    if not path.is_file():
        raise _Gone(f"its source file {out['path']} (recorded by {rec.run_id} seq {rec.seq}) is missing; "
                    "run `dvc checkout`")
    got = hashing.file_digest(path)
    if got != out["digest"]:
        raise _Gone(f"its source file {out['path']} hashes to {got}, {rec.run_id} seq {rec.seq} recorded "
                    f"{out['digest']}")
    try:
        return json.loads(readers.read_bytes(path, "manifest", ReportError))
    except ReportError as e:
        raise _Gone(f"its source file {e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _Gone(f"its source file {out['path']} is not JSON ({e})") from None


def _derived(values: dict[str, Any], src: dict[str, Any]) -> tuple[Any, None]:
    compute = FORMULAS.get(src["formula"])
    if compute is None:
        raise _Gone(f"its formula {src['formula']!r} is not one marin computes")
    missing = [i for i in src["inputs"] if i not in values]
    if missing:
        raise _Gone(f"cannot be recomputed: its input {', '.join(missing)} has no source in the ledger")
    return compute([values[i] for i in src["inputs"]]), None


def _first_line_diff(old: bytes, new: bytes) -> str:
    a, b = old.decode("utf-8", "replace").splitlines(), new.decode("utf-8", "replace").splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return f"line {i} differs from what the ledger gives: {_clip(x)!r} vs {_clip(y)!r}"
    return f"{len(a)} lines where the ledger gives {len(b)}"


def _clip(s: str) -> str:
    return s if len(s) <= 160 else s[:157] + "..."
