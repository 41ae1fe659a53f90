"""``marin report``: write reports/<model>/ from the ledger as a ledger run of stage ``report``.

The report directory holds report.md, report.html, figures/*.svg, model_card.md,
datasheet.md, fmti.csv, mof.yml, lineage.prov.json, report.json (every fact with its
source, and the reference files by digest), ledger_head.json (the ledger snapshot it was
built from) and provenance.intoto.json: a DSSE envelope around an in-toto Statement whose
subjects are the model's tensor digest and every other file, with a SLSA Provenance v1
predicate; signed with ed25519 when the signing key exists, else with ``"signatures": []``.
Everything but the envelope and the snapshot is a pure function of the ledger, the recorded
outputs and the reference files, so ``marin report verify`` (``marin.report.check``)
rebuilds it and compares byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from marin import fsutil, hashing, stages
from marin.attest import dsse, keyring
from marin.config import Params, ReportParams, clock_skew_s
from marin.errors import ParamsError
from marin.ledger import check as ledger_check
from marin.ledger.bodies import Named
from marin.ledger.check import check_run
from marin.ledger.head import Head, head
from marin.ledger.index import Index, with_index
from marin.ledger.prov import prov_json
from marin.ledger.query import Ledger
from marin.ledger.run import Plan, Recipe, Run, recipe_code, recipe_digest
from marin.ledger.store import run_files
from marin.paths import ledger_dir, relpath
from marin.report import cards, experiments, fmti, mof, reference, release, render, toc, training, verifications
from marin.report.facts import ReportError
from marin.report.gather import gather
from marin.report.reference import References
from marin.report.vouching import Files, Vouching
from marin.stages import dvcfiles

ENVELOPE = "provenance.intoto.json"
HEAD_FILE = "ledger_head.json"
BUILD_TYPE = "https://marin.local/pipeline/dvc@v1"
BUILDER = "https://marin.local/builder/marin-report@v1"


def meta_for(p: ReportParams, model_digest: str) -> dict[str, Any]:
    """What the report says about itself (from params.yaml: report) and which model it is about."""
    return {"model_name": p.model_name, "version": p.version, "license": p.license, "model_license": p.license,
            "code_license": p.code_license, "model": model_digest, "report_dir": f"reports/{p.model_name}",
            "authors": list(p.authors), "contact": p.contact, "funding": p.funding, "url": p.url,
            "language": list(p.language), "datasheet": dict(p.datasheet or {}),
            "energy": dataclasses.asdict(p.energy) if p.energy else None}


def render_files(ledger: Ledger, meta: dict[str, Any], refs: References,
                 vouching: Vouching) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every re-derivable report file, as bytes, and the gathered document."""
    root = ledger.root
    facts, doc = gather(root, ledger, meta["model"], vouching)
    meta = {**meta, "date": (doc["lineage"][-1]["finished"] or doc["lineage"][-1]["started"])[:10],
            "model_tensor_digest": facts.items[doc["model"]["tensor_digest"]].value}  # the BibTeX note (CITATION.cff)
    md = toc.with_toc(render.markdown(facts.items, doc, meta))  # heading ids and a contents list
    figures = {**training.figures(doc), **experiments.figures(doc)}
    fd = facts.to_dict()
    report_json = {"schema": "marin.report@1", "meta": meta, "facts": fd, "doc": doc,
                   "references": {k: r.to_dict() for k, r in sorted(refs.items())}}
    files = {"report.md": md, "report.html": toc.heading_ids(render.html_page(
        md, facts.items, figures, f"{meta['model_name']} transparency report")),
             "model_card.md": cards.model_card(fd, doc, meta), "datasheet.md": cards.datasheet(fd, doc, meta),
             "fmti.csv": fmti.fmti(fd, doc, meta, reference.file(root, refs["fmti_indicators"])),
             "mof.yml": yaml.safe_dump(_mof(fd, doc, meta, reference.file(root, refs["mof_licenses"])),
                                       sort_keys=False, allow_unicode=True),
             "report.json": json.dumps(report_json, indent=1, sort_keys=True, ensure_ascii=False) + "\n"}
    files["lineage.prov.json"] = prov_json(ledger.node(ledger.resolve(meta["model"])),
                                           *(ledger.step(r["run_id"]) for r in doc["lineage"]))
    files.update({f"figures/{k}.svg": svg for k, svg in figures.items()})
    return {k: v.encode() for k, v in files.items()}, doc


def _data_remote(root: Path) -> dict[str, str] | None:
    """Where a reader can fetch the data: the project's default DVC remote (`marin publish` fills it)."""
    from marin.remote import default_remote

    found = default_remote(root)
    return {"name": found[0], "url": found[1]} if found else None


def _mof(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any], licenses: Path) -> dict[str, Any]:
    """The MOF release description, with the class it reaches (the schema has no field for it:
    an extra top-level key, which the schema allows)."""
    m = mof.mof(facts, doc, meta)
    return {**m, "classification": {
        **mof.assessment(m, licenses),
        "rule": "a class is reached only when all of its required components and those of the classes below are "
                "included under licenses the MOF accepts for their content type (mof-licenses.json)"}}


def snapshot_bytes(snapshot: Head) -> bytes:
    """ledger_head.json: the snapshot ``marin ledger check --since`` reads."""
    return (json.dumps(snapshot.to_dict(), indent=1) + "\n").encode()


def statement(ledger: Ledger, files: dict[str, bytes], doc: dict[str, Any], facts: dict[str, Any],
              refs: References, snapshot: Head) -> dsse.Statement:
    """The in-toto Statement: subjects (model tensor digest, report files) and the SLSA predicate."""
    runs = [ledger.runs[r["run_id"]] for r in doc["lineage"]]
    model_fact = facts[doc["model"]["tensor_digest"]]
    subjects = [(f"model:{doc['model']['path']} (tensor digest)", model_fact["value"])]
    subjects += [(name, hashing.bytes_digest(data)) for name, data in sorted(files.items())]
    train = next(log for log in runs if log.stage == "train")
    code = train.code
    deps = [dsse.resource(name=f"source:{i['name']}", uri=i.get("locator"), digest=i["digest"])
            for log in runs if log.stage == "fetch" for i in log.bodies("input")]
    deps.append(dsse.resource(name="code", uri="git+file:.", git_commit=code["git_commit"],
                                annotations={"code_digest": code["code_digest"]}))
    if code.get("lock_digest"):
        deps.append(dsse.resource(name="uv.lock", digest=code["lock_digest"]))
    deps += [dsse.resource(name=f"reference:{k}", uri=r.path, digest=r.digest) for k, r in sorted(refs.items())]
    deps += [dsse.resource(name=f"verification:{p}", uri=p, digest=x["digest"])
             for p, x in doc["independent_verification"]["files"].items()]
    deps.append(dsse.resource(uri="marin:ledger", digest=snapshot.root,
                                annotations={"runs": snapshot.runs, "snapshot": HEAD_FILE}))
    predicate = dsse.slsa_predicate(
        build_type=BUILD_TYPE,
        external_parameters={"params": {log.stage: log.params for log in runs},
                             "pipeline": "dvc.yaml"},
        internal_parameters={"determinism_class": train.determinism_class,
                             "seeds": {"root": train.seeds.get("root"),
                                       "derivation": train.seeds.get("derivation")}},
        resolved_dependencies=deps, builder_id=BUILDER, invocation_id=train.run_id,
        started_on=min(log.start.time for log in runs), finished_on=max(log.end.time for log in runs),
        byproducts=[dsse.resource(name=f"ledger:{log.run_id}", digest=log.end.digest,
                                    annotations={"record": "run.finished", "stage": log.stage})
                    for log in runs])
    return dsse.statement(subjects, predicate)


def existing_key(root: Path, p: ReportParams) -> Path | None:
    """The signing key if its file exists (checked to be an ed25519 key); None: the report goes unsigned."""
    try:
        key = keyring.signing_key(root, p)
    except keyring.SigningKeyError:  # neither report.signing_key nor $MARIN_SIGNING_KEY: no key
        return None
    if not key.exists():
        return None
    keyring.load_private_key(key)  # a key that is there but unusable fails before anything is built
    return key


def _configured(root: Path, p: ReportParams) -> str:
    try:
        return fsutil.shown(keyring.signing_key(root, p))
    except keyring.SigningKeyError:
        return f"report.signing_key or ${keyring.KEY_ENV}"


def write(ledger: Ledger, p: ReportParams, refs: References, snapshot: Head, key: Path | None,
          model: str = stages.MODEL, record: Callable[[Path], object] | None = None,
          vsas: Files | None = None, as_of: str | None = None) -> Path:
    """Build reports/<model_name>/ (replaced whole, only once everything is ready), signed when ``key``;
    ``record(tmp)`` runs on the finished directory before it replaces the old one."""
    root = ledger.root
    target = ledger.resolve(model)
    meta = meta_for(p, target.key if target.kind == "digest" else model)
    meta["data_remote"] = _data_remote(root)
    lab_key = keyring.keyid(keyring.load_private_key(key)) if key is not None else None
    files, doc = render_files(ledger, meta, refs, Vouching(vsas or {}, lab_key, as_of or dsse.timestamp()))
    for r in doc["lineage"]:  # vouch for nothing over a ledger that does not check
        problems = check_run(ledger.runs[r["run_id"]])
        if problems:
            raise ReportError(f"the ledger behind the report is not intact: {problems[0]}; see `marin ledger check`")
    files[HEAD_FILE] = snapshot_bytes(snapshot)
    facts = json.loads(files["report.json"])["facts"]
    stmt = statement(ledger, files, doc, facts, refs, snapshot)
    envelope = dsse.sign(stmt, key) if key is not None else dsse.unsigned(stmt)
    out = root / "reports" / p.model_name
    with fsutil.atomic_dir(out) as tmp:
        for name, data in files.items():
            fsutil.write_bytes(tmp / name, data)
        fsutil.write_bytes(tmp / ENVELOPE, (json.dumps(envelope.to_json(), indent=2) + "\n").encode())
        if record is not None:
            record(tmp)
    return out


# -- the report as a ledger run -------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    directory: Path
    run_id: str
    key: Path | None  # the signing key, or None: unsigned
    looked_for: str  # where a key was looked for
    release: dict[str, Any]  # whether MLflow registers it (marin.report.release)


@with_index
def publish(root: Path, params: Params, model: str = stages.MODEL, *, index: Index) -> Published:
    """The report stage: one ledger run ``report`` whose inputs are the ledger snapshot (its head
    before this run), the reference files and the signing key's fingerprint, and whose outputs are
    the report directory and its envelope, snapshot and report.json. ``index``: the command's
    ledger index (else one is opened for the whole build)."""
    p = params.report
    if p is None:
        raise ParamsError("params.yaml: no report section (model_name, version, license, ...); add the one of "
                          "the shipped params.yaml")
    key = existing_key(root, p)
    refs = reference.resolve(root, p)
    refuse_unless_intact(root, Path("reports") / p.model_name)
    snapshot = head(ledger_dir(root), index=index)  # before this run exists: the report never depends on itself
    inputs = [{"name": k, **r.to_dict()} for k, r in sorted(refs.items())]  # the very bytes the report reads
    inputs += [_head_input(root, snapshot)] + ([_key_input(root, key)] if key is not None else [])
    vsas = verifications.current(root)  # read once: the section is built from these very bytes
    inputs += verifications.inputs(vsas)
    plan = Plan.make(root, Recipe("report", params.section("report"), closure=stages.code_files(root, "report")), index)
    released = release.decide(root, p.register, dict(plan.body))
    plan.body["execution"] = {**plan.body.get("execution", {}), "release": released}
    rel = Path("reports") / p.model_name

    def record(tmp: Path) -> None:  # recorded, then published: a ledger that cannot take it keeps the old report
        run.output("report", rel, source=tmp)
        for name, path in (("provenance", ENVELOPE), ("ledger_head", HEAD_FILE), ("report_json", "report.json")):
            run.output(name, rel / path, source=tmp / path)

    with Run.begin(_with_inputs(plan, inputs)) as run:
        index.refresh()  # the ledger as it is now, this run's start included
        ledger = Ledger(root, index, sources=stages.SOURCE_STAGES)
        out = write(ledger, p, refs, snapshot, key, model, record, vsas, run.started.time)
    return Published(out, run.run_id, key, _configured(root, p), released)


def refuse_unless_intact(root: Path, own: Path) -> None:
    """The whole ledger checks as ``marin ledger check`` checks it, its outputs against the files on disk, or
    the report is not built: a run rolled back or deleted, a torn file, or a tampered output would otherwise
    drop out of the report's lineage (its evaluation, say) and the signature would vouch for what is left.
    The report's own folder ``own`` is left out: this build replaces it whole, a hand-edited file included."""
    mine = own.as_posix()
    dvc = ledger_check.DvcOuts(dvcfiles.locked(root), dvcfiles.declared_outs(root))
    found = ledger_check.check(root, dvc, clock_skew_s(root)).problems
    problems = [p for p in found if p.where != mine and not p.where.startswith(f"{mine}/")]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReportError(f"the ledger does not check: {problems[0].where}: {problems[0].what}{more}; run "
                          "`marin ledger check`, fix what it names, then build the report")


def _head_input(root: Path, snapshot: Head) -> dict[str, Any]:
    """The ledger snapshot as an input record: its RFC 6962 root, over ``runs`` runs."""
    size = sum(f.stat().st_size for f in run_files(ledger_dir(root)))
    return {"name": "ledger_head", "path": ledger_dir(root).relative_to(root).as_posix(), "digest": snapshot.root,
            "size": size, "digest_of": "ledger_head", "runs": snapshot.runs}


def _key_input(root: Path, key: Path) -> dict[str, Any]:
    """The signing key's fingerprint (the DSSE keyid: sha256 of the raw public key), never the key."""
    kid = keyring.keyid(keyring.load_private_key(key))
    return {"name": "signing_key", "path": relpath(root, key), "digest": f"sha256:{kid}",
            "size": 32, "digest_of": "public_key"}


def _with_inputs(plan: Plan, records: list[dict[str, Any]]) -> Plan:
    """The plan with inputs digested here (the reference files, as the report read them) or not bytes
    at a path (the snapshot, the key fingerprint), in run.started and its recipe digest as well as in
    the input records."""
    b = plan.body
    added: list[Named] = [{"name": r["name"], "digest": r["digest"]} for r in records]
    inputs = [*b["inputs"], *added]
    body = {**b, "inputs": inputs, "recipe_digest": recipe_digest(
        b["stage"], b["command"], b["params"], recipe_code(b["code"]), inputs, b["determinism_class"])}
    return dataclasses.replace(plan, body=body, input_records=[*plan.input_records, *records])


def report_line(done: Published, root: Path) -> str:
    """What the report stage says when it is done: one line, and whether it signed."""
    how = f"signed: {ENVELOPE}" if done.key is not None else (
        f"NOT SIGNED: no signing key at {done.looked_for}, so {ENVELOPE} has no signatures; "
        "`marin keygen` makes one")
    return f"report: wrote {done.directory.relative_to(root)}/ (run {done.run_id}; {how})"
