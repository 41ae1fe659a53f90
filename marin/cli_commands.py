"""What each ``marin`` command does, given its parsed arguments (``marin.cli`` parses them):
one function per command, each calling library functions with typed arguments and printing
the command's output. Library imports stay inside the functions, so ``marin --help`` and
every command load only what they use."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marin import config
from marin.paths import ledger_dir


def ledger_check(args: argparse.Namespace) -> int:
    from marin.ledger import head
    from marin.ledger.check import DvcOuts, check
    from marin.stages import dvcfiles

    since, signature = None, ""
    if args.since is not None and args.since.is_dir():  # a report: its snapshot as its statement vouches for it
        from marin.report.check import report_snapshot

        since, signature = report_snapshot(args.root, args.since.resolve(), args.key)
        signature = f", report {signature}"
    elif args.since is not None:
        since = head.load_snapshot(args.since)
    skew_s = config.clock_skew_s(args.root) if args.clock_skew_s is None else args.clock_skew_s
    dvc = DvcOuts(dvcfiles.locked(args.root), dvcfiles.declared_outs(args.root))
    report = check(args.root, dvc, skew_s, since, rehash=args.rehash)
    for p in report.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for m in report.missing:
        print(f"{'FAIL' if args.require_outputs else 'MISSING'} {m}", file=sys.stderr)
    for m in report.leftovers:
        print(f"LEFTOVER {m}", file=sys.stderr)
    if args.verbose:
        for n in report.notes:
            print(f"note {n}")
    failed = len(report.problems) + (len(report.missing) if args.require_outputs else 0)
    status = "ok" if not failed else f"{failed} problem(s)"
    missing = f", {len(report.missing)} recorded outputs not on disk" if report.missing else ""
    grown = f", every run of snapshot {since.root[:19]}… ({since.runs} runs{signature}) intact or extended" \
        if since is not None and not failed else ""
    print(f"ledger check: {report.runs} runs, {report.records} records, "
          f"{report.outputs_checked} outputs on disk checked{missing}{grown}: {status}")
    return 0 if not failed else 1


def ledger_head(args: argparse.Namespace) -> int:
    import json

    from marin.ledger import head

    h = head.head(ledger_dir(args.root))
    if args.json:
        print(json.dumps(h.to_dict(), indent=1))
    else:
        print(f"{h.root} {h.runs} runs")
    return 0


def _unreadable_lines(unreadable: dict[str, str]) -> list[str]:
    """The line a reader prints for each run file whose index stops at a line that is not a record."""
    return [f"ledger/runs/{run_id}.jsonl {problem} is not a record; what follows it is not shown: run "
            "`marin ledger check`" for run_id, problem in unreadable.items()]


def ledger_log(args: argparse.Namespace) -> int:
    from marin.ledger.index import Index

    idx = Index.open(args.root)
    rows = idx.runs(args.stage, include_unstarted=args.stage is None, last=None if args.all else args.last)
    total = idx.count(args.stage)
    if len(rows) < total:
        print(f"(the last {len(rows)} of {total} runs; --all or --last N for more)")
    outputs: dict[str, list[str]] = {}
    for r in rows:
        for _, _, _, body in idx.entities(run_id=r.run_id, role="output"):
            shown = f"{body['name']}={body['digest'].split(':')[1][:12]}"
            if "tensor_digest" in body:  # a model: its folder digest, then the digest over its tensors
                shown += f" (tensors {body['tensor_digest'].split(':')[1][:12]})"
            outputs.setdefault(r.run_id, []).append(shown)
    unreadable = idx.unreadable()
    print(f"{'time':20} {'stage':9} {'run id':38} {'recipe':12} {'status':10} outputs")
    for r in rows:
        recipe = r.recipe.split(":")[1][:12] if r.recipe else "?"
        when = r.started[:19].replace("T", " ") if r.started else "?"
        bad = unreadable.get(r.run_id)
        status = r.status + (f" (unreadable {bad.split(':')[0]})" if bad else " (truncated)" if r.truncated else "")
        print(f"{when:20} {r.stage or '?':9} {r.run_id:38} {recipe:12} {status:10} "
              f"{', '.join(outputs.get(r.run_id, []))}")
    for line in _unreadable_lines(unreadable):
        print(f"marin: error: {line}", file=sys.stderr)
    return 1 if unreadable else 0


def ledger_repair(args: argparse.Namespace) -> int:
    from marin.ledger.store import RunFile, resolve_run_id, run_path

    path = run_path(args.root, resolve_run_id(args.root, args.run_id))  # a short id too
    torn = RunFile(path, path.name.removesuffix(".jsonl")).repair()
    if torn is None:
        print(f"{path.name}: last line is complete; nothing to repair")
    else:
        print(f"{path.name}: moved a truncated line of {len(torn)} bytes to {path.name}.torn")
    return 0


def mlflow_sync(args: argparse.Namespace) -> int:
    from marin.net import mlflow_env
    from marin.tracking import sync

    mlflow_env()  # an unreachable server is one line in seconds, as after a stage (the env vars override it)
    print(sync(args.root, args.uri).summary())
    return 0


def params_check(args: argparse.Namespace) -> int:
    config.load(args.root / "params.yaml")
    print(f"{args.root / 'params.yaml'}: valid")
    return 0


def params_show(args: argparse.Namespace) -> int:
    from marin.params_file import dump, read_yaml, with_defaults

    given = read_yaml(args.root / "params.yaml")
    config.parse(given, str(args.root / "params.yaml"))  # refused as a stage would refuse it
    print(dump(with_defaults(given)), end="")
    return 0


def schemas_pin(args: argparse.Namespace) -> int:
    import json

    from marin import fsutil, schemas

    pins = schemas.current_pins()
    fsutil.write_bytes(schemas.PINS, (json.dumps(pins, indent=1, sort_keys=True) + "\n").encode())
    print(f"{schemas.PINS.name}: pinned {len(pins)} schemas; commit it with the schema change")
    return 0


def schemas_check(args: argparse.Namespace) -> int:
    from marin import schemas

    problems = schemas.pin_problems()
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    print(f"schemas: {len(schemas.pins())} pinned: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def lineage(args: argparse.Namespace) -> int:
    from marin.commands import lineage
    from marin.ledger.query import Ledger
    from marin.stages import SOURCE_STAGES

    with Ledger(args.root, sources=SOURCE_STAGES, skip=("metric",)) as ledger:  # lineage never reads metrics
        target = ledger.resolve(args.target)
        if target.note:
            print(f"marin: {'error' if target.changed else 'note'}: {target.note}", file=sys.stderr)
        text = lineage.render(ledger.node(target), args.format)
        unreadable = ledger.index.unreadable()
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    damaged = _unreadable_lines(unreadable)
    for problem in damaged:
        print(f"marin: error: {problem}", file=sys.stderr)
    return 1 if target.changed or damaged else 0


def trace(args: argparse.Namespace) -> int:
    import json

    from marin import readers, trace

    if args.file is not None and not args.file.is_file():
        raise trace.TraceRefused(f"{args.file}: no such file; give a UTF-8 text file to --file")
    text = readers.read_text(args.file, "text") if args.file else trace.argument_text(args.text)
    tp = config.load(args.root / "params.yaml").trace
    least = trace.chosen_min_tokens(args.min_tokens, tp.min_tokens)
    result = trace.run_command(args.root, text, args.run, args.model, args.index, least, tp.max_query_tokens)
    sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=1) + "\n" if args.json
                     else trace.render(result, least))
    return 0


def diff(args: argparse.Namespace) -> int:
    from marin.commands import diff

    d = diff.diff(args.root, args.run_a, args.run_b)
    print(diff.render(d))
    return 0 if d.identical else 1


def verify(args: argparse.Namespace) -> int:
    from marin import verify

    kw = {"segments": args.segments, "seed": args.seed, "xla_flags": tuple(args.xla_flags), "keep": args.keep,
          "signer": _signer(args) if args.sign else None}
    if args.upstream:  # one ledger index for every run verified (verify.verify_upstream opens it)
        rows = verify.verify_upstream(args.root, args.target, **kw)
        code, outcomes = verify.upstream_exit(rows), [o for _, _, o in rows if isinstance(o, verify.Outcome)]
    else:
        out = verify.verify(args.root, args.target, **kw)
        code, outcomes = out.exit_code, [out]
    if args.sign:  # after the verification records are appended: they stay even when signing fails
        from marin.attest import vsa
        from marin.fsutil import shown

        recorded = [(o.run_id, o.record_seq) for o in outcomes if o.record_seq is not None]
        for path in vsa.sign_recorded(args.root, recorded, args.key, args.as_lab):
            print(f"signed: {shown(path)} (commit {vsa.DIR}/ to publish it)")
    return code


def _signer(args: argparse.Namespace) -> str | None:
    """``--sign``: the key id the records will be signed with, written into them (None: no usable key;
    the verification is still recorded, and signing then fails in one line saying why)."""
    from marin.attest import keyring, vsa

    try:
        return keyring.keyid(keyring.load_private_key(vsa.signer_key(args.root, args.key, args.as_lab)))
    except keyring.SigningKeyError:
        return None


def report(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from marin import stages
    from marin.stages.runner import execute

    declared = stages.declaration("report")  # the report stage's runtime, leftovers removed first
    return execute(replace(declared, inputs={**declared.inputs, "model": str(args.model)}), args.root)


def report_verify(args: argparse.Namespace) -> int:
    from marin.report import check

    v = check.verify(args.root, args.directory.resolve(), args.key, args.require_signature or args.release,
                     release=args.release)
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    status = "ok" if v.ok else f"{len(v.problems)} problem(s)"
    print(f"report verify {args.directory}: {v.signature}, {v.checked.get('files', 0)} files, "
          f"{v.checked.get('verifications', 0)} counted verifications re-checked, "
          f"{v.checked.get('facts', 0)} facts re-derived from the ledger: {status}")
    if (stale := v.stale()) is not None:  # later runs: the report is as of its snapshot, not wrong
        print(stale)
    if args.trust is not None and v.ok and v.vouching is not None:  # the recount rests on a report that verified
        from marin.report.verifications import recount_line

        print(recount_line(v.vouching, v.runs, args.trust))
    return 0 if v.ok else 1


def keygen(args: argparse.Namespace) -> int:
    from marin.attest import keyring

    path = args.path or keyring.signing_key(args.root, config.load(args.root / "params.yaml").report)
    if args.if_missing and path.exists():
        print(f"keygen: {path} exists; kept")
        return 0
    private, public = keyring.keygen(path)
    print(f"keygen: wrote {private} (keep it secret; never commit it) and {public}")
    return 0


def pin(args: argparse.Namespace) -> int:
    from marin.data import pins

    cwd = Path.cwd()
    kind = args.kind or pins.infer_kind(args.target, cwd)
    locator = pins.project_locator(args.target, kind, cwd, args.root)
    name = args.name or pins.default_name(locator, kind)
    print(pins.pin(locator, kind, args.root, name).snippet(name), end="")
    return 0


def publish(args: argparse.Namespace) -> int:
    if args.push is not None or args.hf_folder is not None or args.revisions or args.dry_run:
        from marin.commands.hub_publish import hub_publish

        return hub_publish(args)
    from marin.commands.publish import publish

    publish(args.root, args.remote)
    return 0


def sweep(args: argparse.Namespace) -> int:
    from marin.commands.sweep import sweep
    from marin.tracking import sync_quietly

    sweep(args.root, config.load(args.root / "params.yaml"))
    sync_quietly(args.root)  # the sweep as an MLflow parent run with one child per trial
    return 0


def stages(args: argparse.Namespace) -> int:
    from marin import stages as st
    from marin.stages import dvcyaml

    if args.write:
        n = dvcyaml.write(args.root)
        print(f"wrote {st.DVC_YAML} and closures/: {n} stages, code dependencies from their imports")
        return 0
    if args.check:
        problems = dvcyaml.check(args.root)
        for line in problems:
            print(line, file=sys.stderr)
        print(f"stages: {st.DVC_YAML} {'matches' if not problems else 'does not match'} the declared stages and "
              "their import closures")
        return 1 if problems else 0
    for s in st.declared(args.root):
        files = st.code_files(args.root, s.name)
        print(f"{s.name:<9} {s.cmd:<28} {len(files):>3} code files  params: {', '.join(s.params) or '-'}  "
              f"outs: {', '.join(o.path for o in s.outs)}")
    return 0


def status(args: argparse.Namespace) -> int:
    from marin.commands.status import status as stage_status
    from marin.commands.status import workspace
    from marin.ledger.check import leftovers
    from marin.ledger.index import Index
    from marin.stages import dvcfiles

    with Index.using(args.root, None) as index:
        result = stage_status(args.root, index)
        found = workspace(args.root, index)
    for st in result:
        print(st.line(), file=sys.stderr if st.stale else sys.stdout)
    for line in found:
        print(line, file=sys.stderr)
    for line in leftovers(args.root, dvcfiles.declared_outs(args.root)):
        print(f"leftover: {line}", file=sys.stderr)
    stale = [st.stage for st in result if st.stale]
    more = f"; {len(found)} thing(s) in the workspace no run made" if found else ""
    print(f"status: {len(stale)} stale stage(s){': ' + ', '.join(stale) if stale else ''}{more}")
    return 1 if stale or found else 0


def reference_check(args: argparse.Namespace) -> int:
    from marin import reference

    return reference.check(args.root)


def reference_write(args: argparse.Namespace) -> int:
    from marin import reference

    print(f"wrote {reference.write(args.root, args.why)}")
    return 0
