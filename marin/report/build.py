"""``marin report``: write reports/<model>/ from the ledger, and ``marin report verify`` it.

The report directory holds report.md, report.html, figures/*.svg, model_card.md,
datasheet.md, fmti.csv, mof.yml, lineage.prov.json, report.json (every fact with its
source) and provenance.intoto.json: a DSSE envelope, signed with ed25519, around an in-toto
Statement whose subjects are the model's tensor digest and every other file, with a SLSA
Provenance v1 predicate. Everything but the signature is a pure function of the ledger
and the recorded outputs, so verification rebuilds it and compares byte for byte.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marin import fsutil, hashing
from marin.config import ReportParams
from marin.errors import MarinError
from marin.ledger.check import check_run
from marin.lineage import Ledger, to_prov
from marin.report import attest, cards, fmti, mof, render
from marin.report.facts import ReportError, gather

ENVELOPE = "provenance.intoto.json"
BUILD_TYPE = "https://marin.local/pipeline/dvc@v1"
BUILDER = "https://marin.local/builder/marin-report@v1"


def meta_for(p: ReportParams, model_digest: str) -> dict[str, Any]:
    """What the report says about itself (from params.yaml: report) and which model it is about."""
    return {"model_name": p.model_name, "version": p.version, "license": p.license, "model_license": p.license,
            "code_license": p.code_license, "model": model_digest, "report_dir": f"reports/{p.model_name}"}


def render_files(root: Path, meta: dict[str, Any], p: ReportParams | None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every report file but the envelope, as bytes, and the gathered document."""
    facts, doc = gather(root, meta["model"])
    meta = {**meta, "date": (doc["lineage"][-1]["finished"] or doc["lineage"][-1]["started"])[:10]}
    md = render.markdown(facts.items, doc, meta)
    curve = doc["training"]["curve"]
    figures = {key: render.figure_svg(curve, key, title) for key, title in render.CURVES}
    fd = facts.to_dict()
    files = {"report.md": md, "report.html": render.html_page(md, facts.items, figures,
                                                                f"{meta['model_name']} transparency report"),
             "model_card.md": cards.model_card(fd, doc, meta), "datasheet.md": cards.datasheet(fd, doc, meta),
             "fmti.csv": fmti.fmti(fd, doc, meta, _optional(root, p.fmti_indicators if p else None)),
             "mof.yml": yaml.safe_dump(_mof(fd, doc, meta, _optional(root, p.mof_licenses if p else None)),
                                       sort_keys=False, allow_unicode=True),
             "report.json": json.dumps({"schema": "marin.report@1", "meta": meta, "facts": fd, "doc": doc},
                                       indent=1, sort_keys=True, ensure_ascii=False) + "\n"}
    ledger = Ledger(root)
    files["lineage.prov.json"] = to_prov(ledger.node(ledger.resolve(meta["model"]))).serialize(
        format="json", indent=2) + "\n"
    files.update({f"figures/{k}.svg": svg for k, svg in figures.items()})
    return {k: v.encode() for k, v in files.items()}, doc


def _mof(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any], licenses: Path | None) -> dict[str, Any]:
    """The MOF release description, with the class it reaches (the schema has no field for it:
    an extra top-level key, which the schema allows)."""
    m = mof.mof(facts, doc, meta)
    return {**m, "classification": {
        "class": mof.mof_class(m, licenses),
        "rule": "a class is reached only when all of its components and those of the classes below are "
                "included under licenses of the right type" + ("" if licenses else " (built-in license list)")}}


def _optional(root: Path, path: str | None) -> Path | None:
    if not path:
        return None
    p = Path(path) if Path(path).is_absolute() else root / path
    return p if p.is_file() else None


def statement(root: Path, files: dict[str, bytes], doc: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """The in-toto Statement: subjects (model tensor digest, report files) and the SLSA predicate."""
    ledger = Ledger(root)
    runs = [ledger.runs[r["run_id"]] for r in doc["lineage"]]
    model_fact = facts[doc["model"]["tensor_digest"]]
    subjects = [(f"model:{doc['model']['path']} (tensor digest)", model_fact["value"])]
    subjects += [(name, hashing.bytes_digest(data)) for name, data in sorted(files.items())]
    train = next(log for log in runs if log.started.body["stage"] == "train")
    code = train.started.body["code"]
    deps = [attest.resource(name=f"source:{r.body['name']}", uri=r.body.get("locator"), digest=r.body["digest"])
            for log in runs if log.started.body["stage"] == "fetch" for r in log.of_kind("input")]
    deps.append(attest.resource(name="code", uri="git+file:.", git_commit=code["git_commit"],
                                annotations={"code_digest": code["code_digest"]}))
    if code.get("lock_digest"):
        deps.append(attest.resource(name="uv.lock", digest=code["lock_digest"]))
    predicate = attest.slsa_predicate(
        build_type=BUILD_TYPE,
        external_parameters={"params": {log.started.body["stage"]: log.started.body["params"] for log in runs},
                             "pipeline": "dvc.yaml"},
        internal_parameters={"determinism_class": train.started.body["determinism_class"],
                             "seeds": {"root": train.started.body["seeds"].get("root"),
                                       "derivation": train.started.body["seeds"].get("derivation")}},
        resolved_dependencies=deps, builder_id=BUILDER, invocation_id=train.run_id,
        started_on=min(log.started.time for log in runs), finished_on=max(log.finished.time for log in runs),
        byproducts=[attest.resource(name=f"ledger:{log.run_id}", digest=log.finished.digest,
                                    annotations={"record": "run.finished", "stage": log.started.body["stage"]})
                    for log in runs])
    return attest.statement(subjects, predicate)


def signing_key(root: Path, p: ReportParams | None) -> Path:
    """The private key: $MARIN_SIGNING_KEY, else report.signing_key (its public half is ``<key>.pub``)."""
    return attest.key_path(os.environ.get(attest.KEY_ENV) or (p.signing_key if p else None), root)


def write(root: Path, p: ReportParams, model: str = "models/final") -> Path:
    """Build and sign reports/<model_name>/ (replaced whole, only once everything is ready)."""
    key = signing_key(root, p)
    attest.load_private_key(key)  # a missing key fails before anything is built
    ledger = Ledger(root)
    target = ledger.resolve(model)
    meta = meta_for(p, target.key if target.kind == "digest" else model)
    files, doc = render_files(root, meta, p)
    for r in doc["lineage"]:  # sign nothing over a ledger that does not check
        problems = check_run(ledger.runs[r["run_id"]])
        if problems:
            raise ReportError(f"the ledger behind the report is not intact: {problems[0]}; see `marin ledger check`")
    facts = json.loads(files["report.json"])["facts"]
    envelope = attest.sign(statement(root, files, doc, facts), key)
    out = root / "reports" / p.model_name
    with fsutil.atomic_dir(out) as tmp:
        for name, data in files.items():
            fsutil.write_bytes(tmp / name, data)
        fsutil.write_bytes(tmp / ENVELOPE, (json.dumps(envelope, indent=2) + "\n").encode())
    return out


@dataclass
class Verdict:
    directory: Path
    problems: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(root: Path, directory: Path, public_key: Path | None = None) -> Verdict:
    """Numbered steps: 1. signature; 2. every file against its signed digest; 3. the ledger runs
    behind the report are intact; 4. every fact re-derived from the ledger; 5. every file re-rendered."""
    v = Verdict(directory)
    env_path = directory / ENVELOPE
    if not env_path.is_file():
        raise ReportError(f"{env_path}: missing; is {directory} a report directory (marin report)?")
    report_json = directory / "report.json"
    try:
        old = json.loads(report_json.read_text()) if report_json.is_file() else None
        envelope = json.loads(env_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{directory}: report.json or {ENVELOPE} is not valid JSON ({e}): changed after "
                          "signing") from None
    if public_key is None:  # the public half of the configured signing key
        from marin import config

        private = signing_key(root, config.load(root / "params.yaml").report)
        public_key = private.with_name(private.name + ".pub")
    stmt = attest.verify(envelope, public_key)  # 1
    signed = {s["name"]: "sha256:" + s["digest"]["sha256"] for s in stmt["subject"]}
    on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {ENVELOPE}
    for name in sorted(on_disk | {n for n in signed if not n.startswith("model:")}):  # 2
        if name not in signed:
            v.problems.append(f"{name}: not covered by the signed provenance (file added)")
        elif name not in on_disk:
            v.problems.append(f"{name}: signed but missing")
        elif (got := hashing.file_digest(directory / name)) != signed[name]:
            v.problems.append(f"{name}: changed since it was signed ({got}, signed {signed[name]})")
    v.checked["files"] = len(on_disk)
    if old is None:
        v.problems.append("report.json: missing; cannot re-derive the report")
        return v
    ledger = Ledger(root)
    for r in old["doc"]["lineage"]:  # 3
        log = ledger.runs.get(r["run_id"])
        if log is None:
            v.problems.append(f"ledger: run {r['run_id']} behind the report is not in the ledger")
            continue
        v.problems.extend(f"ledger: {p}" for p in check_run(log))
    try:  # 4, 5
        files, _ = render_files(root, {k: old["meta"][k] for k in old["meta"] if k != "date"}, _params(root))
    except (MarinError, KeyError, TypeError) as e:
        v.problems.append(f"ledger: the report cannot be re-derived: {e}")
        return v
    new_facts = json.loads(files["report.json"])["facts"]
    for fid in sorted(set(old["facts"]) | set(new_facts), key=lambda x: (len(x), x)):
        a, b = old["facts"].get(fid), new_facts.get(fid)
        if a != b:
            v.problems.append(_fact_change(fid, a, b))
    v.checked["facts"] = len(new_facts)
    for name, data in sorted(files.items()):
        path = directory / name
        if path.is_file() and path.read_bytes() != data:
            v.problems.append(f"{name}: {_first_line_diff(path.read_bytes(), data)}")
    model_subject = next((d for n, d in signed.items() if n.startswith("model:")), None)
    tensor = new_facts[old["doc"]["model"]["tensor_digest"]]["value"] if old["doc"]["model"]["tensor_digest"] \
        in new_facts else None
    if model_subject != tensor:
        v.problems.append(f"model: the signed tensor digest {model_subject} is not the ledger's {tensor}")
    return v


def _params(root: Path) -> ReportParams | None:
    from marin import config

    try:
        return config.load(root / "params.yaml").report
    except Exception:  # verification does not need params beyond optional reference lists
        return None


def _fact_change(fid: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None:
        return f"{fid} ({b['label']}): in the ledger but not in the report"
    if b is None:
        return f"{fid} ({a['label']}): in the report but no longer derivable from the ledger"
    src = b["source"]
    where = f"{src['run_id']} seq {src['seq']}" if "run_id" in src else src.get("formula", "")
    if a["value"] != b["value"]:
        return f"{fid} ({a['label']}): the report says {a['text']}, the ledger ({where}) says {b['text']}"
    return f"{fid} ({a['label']}): its source changed: report cites {a['source']}, the ledger gives {src}"


def _first_line_diff(old: bytes, new: bytes) -> str:
    a, b = old.decode("utf-8", "replace").splitlines(), new.decode("utf-8", "replace").splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return f"line {i} differs from what the ledger gives: {_clip(x)!r} vs {_clip(y)!r}"
    return f"{len(a)} lines where the ledger gives {len(b)}"


def _clip(s: str) -> str:
    return s if len(s) <= 160 else s[:157] + "..."

def _cmd_report(args: Any) -> int:
    from marin import config

    p = config.load(args.root / "params.yaml").report
    if p is None:
        raise ReportError(f"{args.root / 'params.yaml'}: no report section (model_name, version, license, ...)")
    out = write(args.root, p, args.model)
    print(f"report: wrote {out.relative_to(args.root)}/ (signed: {ENVELOPE})")
    return 0


def _cmd_verify(args: Any) -> int:
    v = verify(args.root, args.directory.resolve(), args.key)
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    status = "ok" if v.ok else f"{len(v.problems)} problem(s)"
    print(f"report verify {args.directory}: signature ok, {v.checked.get('files', 0)} files, "
          f"{v.checked.get('facts', 0)} facts re-derived from the ledger: {status}")
    return 0 if v.ok else 1


def _cmd_keygen(args: Any) -> int:
    from marin import config

    path = args.path or signing_key(args.root, config.load(args.root / "params.yaml").report)
    if args.if_missing and path.exists():
        print(f"keygen: {path} exists; kept")
        return 0
    private, public = attest.keygen(path)
    print(f"keygen: wrote {private} (keep it secret; never commit it) and {public}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``marin report [verify]`` and ``marin keygen``."""
    rep = sub.add_parser("report", help="build, or verify, the signed transparency report of a model")
    rep.add_argument("--model", default="models/final", help="the model: a path, digest or train run id")
    rep.set_defaults(fn=_cmd_report)
    rsub = rep.add_subparsers(dest="report_command")
    ver = rsub.add_parser("verify", help="check a report's signature, files and every number against the ledger")
    ver.add_argument("directory", type=Path)
    ver.add_argument("--key", type=Path, help="public key (default: the signing key's .pub)")
    ver.set_defaults(fn=_cmd_verify)
    key = sub.add_parser("keygen", help="make an ed25519 signing key for reports")
    key.add_argument("path", type=Path, nargs="?", help="private key path (default: report.signing_key)")
    key.add_argument("--if-missing", action="store_true", help="do nothing when the key exists")
    key.set_defaults(fn=_cmd_keygen)
