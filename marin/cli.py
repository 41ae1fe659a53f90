"""The ``marin`` command. MarinErrors become one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from marin import config
from marin.errors import MarinError, SchemaError
from marin.paths import ledger_dir, project_root


def _cmd_ledger_check(args: argparse.Namespace) -> int:
    from marin.ledger import head
    from marin.ledger.check import check

    since = head.load_snapshot(args.since) if args.since else None
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
    grown = f", every run of snapshot {since.root[:19]}… ({since.runs} runs) intact or extended" \
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
    rows = idx.runs(args.stage, include_unstarted=args.stage is None)
    outputs: dict[str, list[str]] = {}
    for r in rows:
        for _, _, _, body in idx.entities(run_id=r.run_id, role="output"):
            outputs.setdefault(r.run_id, []).append(f"{body['name']}={body['digest'].split(':')[1][:12]}")
    print(f"{'time':20} {'stage':9} {'run id':38} {'recipe':12} {'status':10} outputs")
    for r in rows:
        recipe = r.recipe.split(":")[1][:12] if r.recipe else "?"
        when = r.started[:19].replace("T", " ") if r.started else "?"
        status = r.status + (" (truncated)" if r.truncated else "")
        print(f"{when:20} {r.stage or '?':9} {r.run_id:38} {recipe:12} {status:10} "
              f"{', '.join(outputs.get(r.run_id, []))}")
    return 0


def _cmd_ledger_repair(args: argparse.Namespace) -> int:
    from marin.ledger.store import RunFile

    path = ledger_dir(args.root) / f"{args.run_id}.jsonl"
    if not path.is_file():
        raise MarinError(f"{path}: no such run; see `marin ledger log`")
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="marin", description=__doc__)
    ap.add_argument("--root", type=Path, default=None, help="project root (default: auto)")
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks and notes")
    sub = ap.add_subparsers(dest="command", required=True)

    led = sub.add_parser("ledger", help="inspect and check the ledger")
    lsub = led.add_subparsers(dest="ledger_command", required=True)
    chk = lsub.add_parser("check", help="verify schemas, chains, Merkle roots, outputs")
    chk.add_argument("--since", type=Path, metavar="HEAD_OR_REPORT",
                     help="a snapshot (`marin ledger head --json` file, or a report directory): prove "
                          "that each of its runs is still there, unchanged or only extended")
    chk.add_argument("--rehash", action="store_true",
                     help="read every output file again (default: reuse hashes while a file's inode, size "
                          "and times are unchanged)")
    chk.add_argument("--require-outputs", action="store_true",
                     help="fail when a recorded output of the latest runs is not on disk")
    chk.set_defaults(fn=_cmd_ledger_check)
    hd = lsub.add_parser("head", help="RFC 6962 root over every run's last record: a snapshot to keep or sign")
    hd.add_argument("--json", action="store_true", help="the whole snapshot (root, runs, leaves) for --since")
    hd.set_defaults(fn=_cmd_ledger_head)
    log = lsub.add_parser("log", help="list runs")
    log.add_argument("--stage")
    log.set_defaults(fn=_cmd_ledger_log)
    rep = lsub.add_parser("repair", help="set aside a truncated last line of a run")
    rep.add_argument("run_id")
    rep.set_defaults(fn=_cmd_ledger_repair)

    ml = sub.add_parser("mlflow", help="the MLflow view of the ledger")
    msub = ml.add_subparsers(dest="mlflow_command", required=True)
    syn = msub.add_parser("sync", help="create or complete MLflow runs from the ledger (idempotent)")
    syn.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    syn.set_defaults(fn=_cmd_mlflow_sync)

    from marin import diff, lineage, verify

    lineage.add_parser(sub)
    diff.add_parser(sub)
    verify.add_parser(sub)
    from marin.report import build as report

    report.add_parser(sub)

    sch = sub.add_parser("schemas", help="the pinned JSON Schema set that records are checked against")
    ssub = sch.add_subparsers(dest="schemas_command", required=True)
    ssub.add_parser("check", help="every schema file is the pinned one").set_defaults(fn=_cmd_schemas_check)
    ssub.add_parser("pin", help="after an intended schema change: record the new digests").set_defaults(
        fn=_cmd_schemas_pin)

    par = sub.add_parser("params", help="validate params.yaml")
    psub = par.add_subparsers(dest="params_command", required=True)
    psub.add_parser("check").set_defaults(fn=_cmd_params_check)
    return ap


def guarded(fn: Callable[[], int], verbose: bool = False) -> int:
    """Run ``fn``; a MarinError, or a failing disk (full, quota, read-only, I/O error),
    becomes one line on stderr and an exit code."""
    from marin.fsutil import disk_cause, shown

    try:
        return fn()
    except MarinError as e:
        if verbose:
            raise
        print(f"marin: error: {e.diagnostics()}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        cause = disk_cause(e)
        if verbose or cause is None:
            raise
        where = f"{shown(e.filename)}: " if isinstance(e.filename, str) else ""
        print(f"marin: error: {where}{cause}; free space (or fix the disk) and rerun", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("marin: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = (args.root or project_root()).resolve()
    return guarded(lambda: args.fn(args), args.verbose)


def stage_main(stage: Callable[[Path, config.Params], None]) -> None:
    """Entry point of a pipeline/ script: validate params, run the stage, exit cleanly."""
    verbose = "-v" in sys.argv or "--verbose" in sys.argv

    def go() -> int:
        root = project_root()
        params = config.load(root / "params.yaml")  # before any work: exit 2, no run started
        from marin import schemas

        for problem in schemas.pin_problems()[:1]:  # records are written only against the pinned schemas
            raise SchemaError(problem)
        stage(root, params)
        from marin.tracking import sync_quietly

        sync_quietly(root)  # the MLflow view; never fails the stage
        return 0

    sys.exit(guarded(go, verbose))


if __name__ == "__main__":
    sys.exit(main())
