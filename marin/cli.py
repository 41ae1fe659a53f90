"""The ``marin`` command. MarinErrors become one line on stderr and an exit code.

Argument parsing lives here only (what each command then does: ``marin.cli_commands``); the
help texts are written for the person at the prompt."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TypeAlias

from marin import cli_commands as cmd
from marin import stages
from marin.errors import NotAProjectError
from marin.paths import NOT_A_PROJECT, is_project, project_root
from marin.stages import NAMES as STAGES
from marin.stages.runner import guarded

DESCRIPTION = """\
Inspect, check, replay and publish what the marin pipeline recorded. The pipeline itself
runs with `dvc repro` (stages: fetch, curate, tokenize, train, instructions, sft, decontaminate, trace_index,
evaluate, evaluate_instruct, export, export_instruct, report); every stage run is written to the ledger
in ledger/runs/, which these commands read."""

EPILOG = """\
examples:
  marin ledger log                    the latest runs and their outputs
  marin ledger check                  every run, hash chain and recorded output holds
  marin status                        outputs whose stage's code changed since they were made
  marin lineage models/final          the runs and data behind the model
  marin trace "TEXT"                  the training documents that hold spans of TEXT verbatim
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
  (--sign)         that record as a signed SLSA verification summary (in-toto, DSSE, ed25519) in
                   verifications/<run_id>/<key id>.intoto.json; without a key this fails after
                   the record is appended (make one with `marin keygen`)

exit status:
  0  bit-exact
  1  mismatch: the first diverging record is named
  3  the verifier's determinism class differs: distances are reported, never "bit-exact"
  4  cannot verify here (uncommitted code, an input nowhere to be found)"""


def seconds(text: str) -> float:
    """A non-negative, finite number of seconds (an option's value)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


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
    chk.add_argument("--clock-skew-s", type=seconds, metavar="S",
                     help="the clock skew allowed between records, in seconds (default: ledger.clock_skew_s of "
                          "the checked project's params.yaml, which its author wrote: an auditor passes their own)")
    chk.set_defaults(fn=cmd.ledger_check)
    hd = lsub.add_parser("head", help="RFC 6962 root over every run's last record: a snapshot to keep or sign")
    hd.add_argument("--json", action="store_true", help="the whole snapshot (root, runs, leaves) for --since")
    hd.set_defaults(fn=cmd.ledger_head)
    log = lsub.add_parser("log", help="list runs: stage, run id, recipe, status, outputs (folder digests)",
                          description="List ledger runs, newest last. Outputs show the first 12 hex digits of "
                                      "their digest (the sha256 of the file, or of a folder's file list); the "
                                      "model also shows its tensor digest (the sha256 over its tensors).")
    log.add_argument("--stage", choices=STAGES, help="only runs of this stage")
    log.add_argument("--last", type=int, default=50, metavar="N", help="the N most recent runs (default 50)")
    log.add_argument("--all", action="store_true", help="every run, oldest first")
    log.set_defaults(fn=cmd.ledger_log)
    rep = lsub.add_parser("repair", help="set aside a truncated last line of a run")
    rep.add_argument("run_id", metavar="RUN_ID", help="the run whose ledger file ends in a torn line "
                     "(as `marin ledger check` names it, e.g. train-20261130T101500-ab12cd34)")
    rep.set_defaults(fn=cmd.ledger_repair)


def _mlflow(sub: Sub) -> None:
    ml = sub.add_parser("mlflow", help="the MLflow view of the ledger")
    msub = ml.add_subparsers(dest="mlflow_command", required=True, metavar="SUBCOMMAND")
    syn = msub.add_parser("sync", help="create or complete MLflow runs from the ledger (idempotent)",
                          description="Create or complete MLflow runs from the ledger (idempotent). Each request "
                                      "to a tracking server waits at most 10 s and is not retried, unless "
                                      "MLFLOW_HTTP_REQUEST_TIMEOUT or MLFLOW_HTTP_REQUEST_MAX_RETRIES say otherwise.")
    syn.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    syn.set_defaults(fn=cmd.mlflow_sync)


def _lineage(sub: Sub) -> None:
    p = sub.add_parser("lineage", help="the runs and digests behind a file, digest or run id",
                       description="The runs and digests behind a file, digest or run id. Exit status 1, the "
                                   "recorded tree still shown, when the file on disk is none of its recorded "
                                   "versions or a run file in the lineage has a line that does not parse.")
    p.add_argument("target", metavar="TARGET",
                   help="a run id (or a short one: a unique prefix, its 8-hex tail), a digest (sha256:<hex> or a "
                        "unique hex prefix of 8+ digits) or a path")
    p.add_argument("--format", choices=("text", "prov-json"), default="text",
                   help="an indented tree (default) or W3C PROV-JSON")
    p.add_argument("--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(fn=cmd.lineage)


def _trace(sub: Sub) -> None:
    p = sub.add_parser("trace", help="the spans of a text that occur verbatim in the training data, and where",
                       description="The maximal spans of at least trace.min_tokens tokens of a text that occur "
                                   "verbatim in the training data (the index stage trace_index built), each with its "
                                   "count, its documents (id, source, licence, position, a snippet with the span "
                                   "marked) and its unigram probability, rarest first. Refused in one line (exit 1) "
                                   "for text the tokenizer cannot encode and for an index whose training-data digest "
                                   "is not the one the model's training run recorded.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("text", nargs="?", metavar="TEXT", help="the text to trace")
    src.add_argument("--file", type=Path, metavar="FILE", help="trace the UTF-8 text in FILE")
    src.add_argument("--run", metavar="RUN", help="trace the samples an evaluate or evaluate_instruct run recorded")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.add_argument("--min-tokens", type=int, metavar="N",
                   help="the shortest span traced, in tokens (default: trace.min_tokens in params.yaml)")
    p.add_argument("--model", type=Path, default=Path(stages.MODEL),
                   help="the model whose training data the index must be (default models/final; --run: the run's)")
    p.add_argument("--index", type=Path, default=stages.declaration("trace_index").out("trace_index"),
                   help="the index (default data/trace_index)")
    p.set_defaults(fn=cmd.trace)


def _diff(sub: Sub) -> None:
    p = sub.add_parser("diff", help="compare two ledger runs and name their first divergence",
                       description="Compare two runs: params, code, determinism class, inputs, outputs and "
                                   "metrics, and name the first record where they diverge. Exit 0 when identical.")
    p.add_argument("run_a", metavar="RUN_A", help="a run id (see `marin ledger log`), a unique prefix of one, or its "
                   "8-hex tail (as MLflow's run names show it)")
    p.add_argument("run_b", metavar="RUN_B", help="the run id to compare it with")
    p.set_defaults(fn=cmd.diff)


def _verify(sub: Sub) -> None:
    p = sub.add_parser("verify", help="replay a recorded run and compare it bit for bit",
                       description=VERIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a run id (or a unique prefix, or its 8-hex tail); with --upstream, also a digest "
                   "or a path (models/final)")
    p.add_argument("--segments", type=int, metavar="K", help="train runs: replay K drawn checkpoint intervals")
    p.add_argument("--seed", type=int, help="seed of the --segments draw (default: random, recorded)")
    p.add_argument("--upstream", action="store_true", help="verify TARGET and every run in its lineage")
    p.add_argument("--xla-flags", action="append", default=[], metavar="FLAG",
                   help="force an XLA flag on the replay (changes the determinism class: exit 3)")
    p.add_argument("--keep", action="store_true", help="keep the workspace for inspection")
    p.add_argument("--sign", action="store_true",
                   help="after the verification record is appended: write a signed SLSA verification summary "
                        "to verifications/<run_id>/<key id>.intoto.json and the public key to "
                        "verifications/keys/<key id>.pub (commit both; `marin report` lists them)")
    p.add_argument("--key", type=Path, metavar="KEY",
                   help="with --sign: your ed25519 private key (`marin keygen PATH` makes one; the lab lists "
                        "third parties' keys in verifications/verifiers.json)")
    p.add_argument("--as-lab", action="store_true",
                   help="with --sign: sign with the lab's report key ($MARIN_SIGNING_KEY, else report.signing_key); "
                        "the report counts such a VSA as the lab's own replay, never as independent")
    p.set_defaults(fn=cmd.verify)


def _report(sub: Sub) -> None:
    rep = sub.add_parser(
        "report", help="build the transparency report of a model (or verify one: `marin report verify DIR`)",
        usage="marin report [--model MODEL]\n       marin report verify DIRECTORY [--key PUB] [--require-signature] "
              "[--release] [--trust FILE]",
        description="Without a subcommand: build reports/<report.model_name>/ from the ledger, as a ledger run "
                    "(the same as the report stage of `dvc repro`). With `verify`: check a report that was built.")
    rep.add_argument("--model", default=stages.MODEL,
                     help="the model to report on: a path, a digest or a train run id (default: models/final)")
    rep.set_defaults(fn=cmd.report)
    rsub = rep.add_subparsers(dest="report_command", title="optional subcommand", metavar="verify")
    ver = rsub.add_parser("verify", prog="marin report verify",  # not the parent's two-line usage as a prefix
                          help="check a report's signature, files and every number against the ledger",
                          description="Check a report: its signature, that every file is the one the provenance "
                                      "statement lists, and that every number is re-derived from the ledger "
                                      "record it cites.")
    ver.add_argument("directory", type=Path, metavar="DIRECTORY",
                     help="the report directory, e.g. reports/marin-tiny")
    ver.add_argument("--key", type=Path, help="public key (default: the signing key's .pub)")
    ver.add_argument("--require-signature", action="store_true",
                     help="fail when the report is not signed")
    ver.add_argument("--release", action="store_true",
                     help="the release check: fail when the report is not signed or still carries params.yaml's "
                          "placeholders (authors 'marin contributors', a contact @marin.local, no url)")
    ver.add_argument("--trust", type=Path, metavar="FILE",
                     help="recount the independent verifications with your own list of verifier keys "
                          "(verifications/verifiers.json's format), not the lab's")
    ver.set_defaults(fn=cmd.report_verify)
    key = sub.add_parser("keygen", help="make an ed25519 signing key for reports")
    key.add_argument("path", type=Path, nargs="?", help="private key path (default: report.signing_key)")
    key.add_argument("--if-missing", action="store_true", help="do nothing when the key exists")
    key.set_defaults(fn=cmd.keygen)


def _schemas(sub: Sub) -> None:
    sch = sub.add_parser("schemas", help="the pinned JSON Schema set that records are checked against")
    ssub = sch.add_subparsers(dest="schemas_command", required=True, metavar="SUBCOMMAND")
    ssub.add_parser("check", help="every schema file is the pinned one").set_defaults(
        fn=cmd.schemas_check, needs_project=False)  # the schemas of the installed package
    ssub.add_parser("pin", help="after an intended schema change: record the new digests").set_defaults(
        fn=cmd.schemas_pin, needs_project=False)


def _params(sub: Sub) -> None:
    par = sub.add_parser("params", help="validate params.yaml")
    psub = par.add_subparsers(dest="params_command", required=True, metavar="SUBCOMMAND")
    psub.add_parser("check", help="check params.yaml against its schema; one line per problem").set_defaults(
        fn=cmd.params_check)
    psub.add_parser("show", help="print the params every stage reads: params.yaml over the pipeline's defaults "
                    "(marin/defaults.yaml)").set_defaults(fn=cmd.params_show)


def _pin(sub: Sub) -> None:
    from marin.data.sources import KINDS

    p = sub.add_parser("pin", help="the sha256 pin of your own data, as fetch computes it, and a params.yaml snippet")
    p.add_argument("target", metavar="PATH_OR_URL",
                   help="a directory, a file, a quoted glob ('corpus/*.jsonl.gz'), an http(s) URL or "
                        "pypi:NAME==VERSION; paths relative to the current directory")
    p.add_argument("--name", help="the source name in params.yaml (default: from the path)")
    p.add_argument("--kind", choices=KINDS, help="the source kind (default: from PATH_OR_URL)")
    p.set_defaults(fn=cmd.pin)


def _publish(sub: Sub) -> None:
    p = sub.add_parser("publish", help="push data, model, report and the checkpoints verify needs to the DVC "
                                       "remote, and record where each object lives")
    p.add_argument("--remote", help="the DVC remote (default: the project's default remote)")
    p.add_argument("--hf-folder", type=Path, metavar="OUT",
                   help="instead: write models/hf into the new folder OUT as exactly the files "
                        "huggingface_hub.upload_folder sends, and print the command that pushes it")
    p.add_argument("--revisions", action="store_true",
                   help="with --hf-folder: also each checkpoint of the train run behind it as a Hub revision "
                        "(OUT-revisions/step<N>/, its tensor digest checked and recorded in revisions.json)")
    p.add_argument("--push", metavar="REPO", help="send the Hub folder to the Hub repository REPO (main) and, with "
                   "--revisions, each revision to its branch step<N>; into a temporary folder unless --hf-folder")
    p.add_argument("--dry-run", action="store_true", help="with --push: print what each push would send, send nothing")
    p.set_defaults(fn=cmd.publish)


def _sweep(sub: Sub) -> None:
    p = sub.add_parser("sweep", help="run the trials of params.yaml's sweep (each a `dvc exp run`), record them and "
                                     "the selected one in the ledger, and apply the selected experiment")
    p.set_defaults(fn=cmd.sweep)


def _stages(sub: Sub) -> None:
    p = sub.add_parser("stages", help="the pipeline's stages and their code (import closures); dvc.yaml from them")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--check", action="store_true", help="exit 1, naming each difference, when dvc.yaml does not "
                                                         "match the declared stages and their code")
    how.add_argument("--write", action="store_true", help="write dvc.yaml from the declarations "
                     "(marin/stages/table.py)")
    p.set_defaults(fn=cmd.stages)


def _reference(sub: Sub) -> None:
    ref = sub.add_parser("reference", help="compare your outputs with the published digests of the shipped "
                                           "pipeline (published-digests.json), without the ledger")
    rsub = ref.add_subparsers(dest="reference_command", required=True, metavar="ACTION")
    p = rsub.add_parser("check", help="the tensor digests of models/final and models/instruct and every value of "
                                      "metrics/eval.json against the published ones; exit 1 naming each difference")
    p.set_defaults(fn=cmd.reference_check)
    p = rsub.add_parser("write", help="(maintainers) publish the current outputs, after a change that alters the "
                                      "bits on purpose")
    p.add_argument("--why", required=True, help="one line saying why the bits changed (kept in the file)")
    p.set_defaults(fn=cmd.reference_write)


def _status(sub: Sub) -> None:
    p = sub.add_parser("status", help="outputs made by code that is no longer their stage's code (stale), "
                                      "module by module; exit 1 when any is stale")
    p.set_defaults(fn=cmd.status)


def _launch(sub: Sub) -> None:
    p = sub.add_parser("launch", help="start a multi-host run: one command on every node of a Ray cluster, as "
                                      "process i of N (MARIN_COORDINATOR, MARIN_PROCESS_ID, MARIN_NUM_PROCESSES)")
    lsub = p.add_subparsers(dest="launch_command", required=True, metavar="ON")
    ray = lsub.add_parser("ray", help="on the Ray cluster at RAY_ADDRESS; each node runs the command in the folder "
                                      "its Ray was started from",
                          usage="marin launch ray [--nodes N] [--per-node K] -- COMMAND")
    ray.add_argument("--nodes", type=int, default=None, help="how many nodes (default: every live node)")
    ray.add_argument("--per-node", type=int, default=1, metavar="K",
                     help="processes per node (default 1), numbered node by node: node 0 runs 0 to K-1")
    ray.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                     help="a variable for every process (repeatable): VALUE, or without it the value here; each "
                          "node's own environment is the one its `ray start` had")
    ray.add_argument("--port", type=int, default=0, help="the coordinator's port on the head (default: a free one)")
    ray.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                     help="after --: the command each node runs, e.g. uv run python -m pipeline.train")
    ray.set_defaults(fn=_launch_ray, needs_project=False)


def _launch_ray(args: argparse.Namespace) -> int:
    from marin.launch import launch

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return launch(argv, args.nodes, args.per_node, args.port, args.env)


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
    for group in (_ledger, _status, _mlflow, _lineage, _trace, _diff, _verify, _report, _stages, _schemas, _params,
                  _pin, _publish, _sweep, _reference, _launch):
        group(sub)
    return ap


def _in_project(args: argparse.Namespace) -> int:
    """Run the command; one that needs a project refuses, writing nothing, where there is none."""
    if getattr(args, "needs_project", True) and not is_project(args.root):
        where = f"--root {args.root}" if args.root_given else str(args.root)
        raise NotAProjectError(f"{where}: {NOT_A_PROJECT}; run it in the project's folder or pass --root DIR")
    return args.fn(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root_given = args.root is not None
    args.root = (args.root or project_root()).resolve()
    return guarded(lambda: _in_project(args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
