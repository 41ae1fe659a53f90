"""The ``marin`` command. MarinErrors become one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from marin import config
from marin.errors import MarinError
from marin.paths import ledger_dir, project_root


def _cmd_ledger_check(args: argparse.Namespace) -> int:
    from marin.ledger.check import check

    report = check(args.root)
    for p in report.problems:
        print(f"FAIL {p}", file=sys.stderr)
    if args.verbose:
        for n in report.notes:
            print(f"note {n}")
    status = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    print(
        f"ledger check: {report.runs} runs, {report.records} records, "
        f"{report.outputs_checked} outputs on disk checked: {status}"
    )
    return 0 if report.ok else 1


def _cmd_ledger_log(args: argparse.Namespace) -> int:
    from marin.ledger.store import read_all

    logs = read_all(ledger_dir(args.root))
    if args.stage:
        logs = [log for log in logs if log.started and log.started.body["stage"] == args.stage]
    print(f"{'time':20} {'stage':9} {'run id':38} {'recipe':12} {'status':10} outputs")
    for log in logs:
        s = log.started
        stage = s.body["stage"] if s else "?"
        recipe = s.body["recipe_digest"].split(":")[1][:12] if s else "?"
        when = s.time[:19].replace("T", " ") if s else "?"
        status = log.status + (" (truncated)" if log.truncated is not None else "")
        outs = ", ".join(
            f"{r.body['name']}={r.body['digest'].split(':')[1][:12]}" for r in log.of_kind("output")
        )
        print(f"{when:20} {stage:9} {log.run_id:38} {recipe:12} {status:10} {outs}")
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="marin", description=__doc__)
    ap.add_argument("--root", type=Path, default=None, help="project root (default: auto)")
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks and notes")
    sub = ap.add_subparsers(dest="command", required=True)

    led = sub.add_parser("ledger", help="inspect and check the ledger")
    lsub = led.add_subparsers(dest="ledger_command", required=True)
    lsub.add_parser("check", help="verify schemas, chains, Merkle roots, outputs").set_defaults(
        fn=_cmd_ledger_check
    )
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

    par = sub.add_parser("params", help="validate params.yaml")
    psub = par.add_subparsers(dest="params_command", required=True)
    psub.add_parser("check").set_defaults(fn=_cmd_params_check)
    return ap


def guarded(fn: Callable[[], int], verbose: bool = False) -> int:
    """Run ``fn``; a MarinError becomes one line on stderr and its exit code."""
    try:
        return fn()
    except MarinError as e:
        if verbose:
            raise
        print(f"marin: error: {e.diagnostics()}", file=sys.stderr)
        return e.exit_code
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
        stage(root, params)
        from marin.tracking import sync_quietly

        sync_quietly(root)  # the MLflow view; never fails the stage
        return 0

    sys.exit(guarded(go, verbose))


if __name__ == "__main__":
    sys.exit(main())
