"""A ledger run: one execution of one stage, from ``run.started`` to ``run.finished``.

    recipe = Recipe("curate", params, [Input(...)], closure=stages.code_files(root, "curate"))
    with Run.start(root, recipe) as run:
        ...do the work...
        run.output("train", "data/curated/train.parquet")

An exception inside the block appends ``run.finished`` with status ``failed`` and the
error, then propagates; if that append fails too (the ledger's disk is full), the run
stays ``unfinished`` and the first error still propagates. A killed process leaves the
run ``unfinished``; the train stage may resume it (``Run.resume``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

from marin import env, hashing
from marin.errors import LedgerError
from marin.ledger import listing
from marin.ledger.bodies import (
    CheckpointBody,
    DeterminismClass,
    Env,
    EvalBody,
    InputBody,
    Kind,
    MetricBody,
    Named,
    OutputBody,
    PublicationBody,
    RunFinished,
    RunResumed,
    RunStarted,
    Seeds,
    SelectionBody,
    TrialBody,
    VerificationBody,
)
from marin.ledger.hash_cache import HashCache
from marin.ledger.index import Index, seed
from marin.ledger.records import Record, new_run_id
from marin.ledger.store import RunFile, read_run
from marin.paths import ledger_dir, relpath

MAX_ENTRIES = 10_000
# "<sweep run id>:<trial index>": set by `marin sweep` for the stages of one trial (run.started.execution.sweep).
SWEEP_VAR = "MARIN_SWEEP_TRIAL"


@dataclass(frozen=True)
class Input:
    """An input named in the recipe: a path whose digest is taken when the run starts."""

    name: str
    path: str  # project-relative
    license: str | None = None
    locator: str | None = None


@dataclass(frozen=True)
class Recipe:
    """What a run is asked to be, as the stage that starts it says: the stage, its params and inputs, and the
    facts of its pipeline the ledger records but does not know (the ledger imports no stage)."""

    stage: str
    params: dict[str, Any]
    inputs: Sequence[Input] = ()
    # the stage's code files (marin.stages.code_files): their digest is in the recipe; None records none
    closure: Sequence[str] | None = None
    det_class: DeterminismClass | None = None  # None: the data class of this machine
    seeds: Seeds | None = None
    command: list[str] | None = None  # None: this process's argv
    fingerprint: Env | None = None  # None: this machine's
    execution: dict[str, Any] | None = None  # where the run ran (engine, workers): recorded, not in the recipe
    # paths the run reads that are not inputs (fetch's local sources): an uncommitted change to them where
    # git tracks them makes the run dirty, as for inputs
    tracked: Sequence[str] = ()


def recipe_code(code: Mapping[str, Any]) -> str:
    """The code digest a run's recipe covers: its stage's closure (runs recorded before closures
    were recorded: the whole code)."""
    return code.get("closure_digest") or code["code_digest"]


def recipe_digest(
    stage: str, command: list[str], params: dict[str, Any], code_digest: str,
    inputs: Sequence[Named] | Sequence[dict[str, str]], det_class: Mapping[str, Any],
) -> str:
    """Digest of everything that should determine a run's outputs."""
    return hashing.json_digest({
        "stage": stage, "command": command, "params": params, "code_digest": code_digest,
        "inputs": sorted(inputs, key=lambda i: i["name"]), "determinism_class": det_class,
    })


def sweep_tag(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"sweep": {"run_id", "trial"}}`` when this process runs a trial of a sweep, else ``{}``."""
    value = (os.environ if environ is None else environ).get(SWEEP_VAR, "")
    run_id, _, trial = value.rpartition(":")
    if not run_id or not trial.isdigit():
        if value:
            raise LedgerError(f"{SWEEP_VAR}={value!r} is not '<sweep run id>:<trial index>'; unset it")
        return {}
    return {"sweep": {"run_id": run_id, "trial": int(trial)}}


def dvc_experiment_tag(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"dvc_experiment": {"name", "baseline_rev"}}`` when DVC runs this stage for ``dvc exp run`` (it sets
    ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV``), so a row of ``dvc exp show`` leads to its ledger runs."""
    env = os.environ if environ is None else environ
    name = env.get("DVC_EXP_NAME", "")
    if not name:
        return {}
    base = env.get("DVC_EXP_BASELINE_REV", "")
    return {"dvc_experiment": {"name": name[:200], **({"baseline_rev": base[:64]} if base else {})}}


def process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used since it started, imports included, and those of
    the child processes it has waited for (``os.times``): the measured process time a run.finished states.
    Processes it did not wait for (the other workers of a multi-process layout) are not in it."""
    t = os.times()
    return round(t.user + t.system + t.children_user + t.children_system, 3)


@dataclass
class Plan:
    """Everything ``run.started`` will say, computed before the run exists (so that a
    stage can first look for an unfinished run of the same recipe to resume)."""

    root: Path
    body: RunStarted
    input_records: list[InputBody]
    t0: float
    hashes: HashCache | None = None  # the file-hash cache the inputs were digested with (the run closes it)

    @property
    def recipe_digest(self) -> str:
        return self.body["recipe_digest"]

    @classmethod
    def make(cls, root: Path, recipe: Recipe, index: Index | None = None) -> Plan:
        """Digest the inputs and state the run; ``index``: the command's ledger index (else one is opened,
        and closed with the run's file hashes)."""
        t = time.perf_counter()
        root, r = Path(root), recipe
        fp = r.fingerprint or env.fingerprint()
        det = r.det_class or env.data_class(fp)
        closure = None if r.closure is None else list(r.closure)
        code = env.code_state(root, [*(i.path for i in r.inputs), *r.tracked], closure=closure)
        command = r.command or [relpath(root, sys.argv[0]), *sys.argv[1:]]
        hashes = HashCache(root, index=index)  # each input read once for sha256 and md5, not again while unchanged
        digested: list[tuple[Input, str, int, str]] = []
        for i in r.inputs:
            p = root / i.path
            if not p.exists():
                hashes.close()
                raise LedgerError(f"input {i.name}: {i.path} does not exist; run the stage that makes it")
            d = hashing.digest_path(p, hashes)
            digested.append((i, d.digest, d.size, d.dvc_md5))
        recipe_inputs: list[Named] = [{"name": i.name, "digest": d} for i, d, _, _ in digested]
        body: RunStarted = {
            "stage": r.stage, "command": command, "params": r.params,
            "recipe_digest": recipe_digest(r.stage, command, r.params, recipe_code(code), recipe_inputs, det),
            "inputs": recipe_inputs, "code": code, "env": fp, "determinism_class": det,
            "determinism_digest": env.class_digest(det), "seeds": r.seeds or {},
        }
        execution = {**(r.execution or {}), **sweep_tag(), **dvc_experiment_tag()}
        if execution:
            body["execution"] = execution
        return cls(root, body, [_input_body(i, d, size, md5) for i, d, size, md5 in digested], t, hashes)


def _input_body(i: Input, digest: str, size: int, md5: str) -> InputBody:
    rec: InputBody = {"name": i.name, "path": i.path, "digest": digest, "size": size, "dvc_md5": md5}
    if i.license:
        rec["license"] = i.license
    if i.locator:
        rec["locator"] = i.locator
    return rec


class Run:
    """An open ledger run. Create with :meth:`start` or :meth:`resume`, and use it in a ``with`` block: it
    finishes at the block's end (failed on an exception) and closes the file hashes it keeps."""

    def __init__(self, root: Path, file: RunFile, started: Record, t0: float | None = None,
                 hashes: HashCache | None = None):
        self.root = root
        self.file = file
        self.started = started
        self.t0 = time.perf_counter() if t0 is None else t0
        self.ledger_s = 0.0
        self.hashes = hashes or HashCache(root)  # the file digests of its inputs and outputs, kept
        self._outputs: list[Named] = []

    @property
    def run_id(self) -> str:
        return self.file.run_id

    @property
    def recipe_digest(self) -> str:
        return self.started.body["recipe_digest"]

    # -- creation ------------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, recipe: Recipe, index: Index | None = None) -> Run:
        """Digest the inputs, write ``run.started`` and one ``input`` record per input."""
        return cls.begin(Plan.make(root, recipe, index))

    @classmethod
    def begin(cls, plan: Plan) -> Run:
        """Start a new run from a plan."""
        run_id = new_run_id(plan.body["stage"])
        file = RunFile(ledger_dir(plan.root) / f"{run_id}.jsonl", run_id)
        run = cls(plan.root, file, file.append("run.started", plan.body), t0=plan.t0, hashes=plan.hashes)
        for rec in plan.input_records:
            run.file.append("input", rec)
        run.ledger_s += time.perf_counter() - plan.t0
        return run


    @classmethod
    def resume(cls, root: Path, run_id: str, reason: str, *, from_step: int | None = None,
               execution: dict[str, Any] | None = None) -> Run:
        """Reopen an unfinished run and record who continues it and from where."""
        root = Path(root)
        path = ledger_dir(root) / f"{run_id}.jsonl"
        log = read_run(path)
        if log.started is None or log.finished is not None:
            raise LedgerError(f"{path}: run {run_id} is not an unfinished run; cannot resume it")
        file = RunFile(path, run_id, functools.partial(seed, path, run_id))  # the Merkle range from the index
        if log.truncated is not None:
            file.repair()
        run = cls(root, file, log.started)
        run._outputs = [
            {"name": r.body["name"], "digest": r.body["digest"]} for r in log.of_kind("output")
        ]
        body: RunResumed = {"from_seq": log.records[-1].seq, "reason": reason, "env": env.fingerprint(),
                            "code": env.code_state(root)}
        if from_step is not None:
            body["from_step"] = from_step
        if execution:
            body["execution"] = execution
        run.record("run.resumed", body)
        return run

    # -- records ------------------------------------------------------------------------

    @overload
    def record(self, kind: Literal["run.started"], body: RunStarted) -> Record: ...
    @overload
    def record(self, kind: Literal["run.resumed"], body: RunResumed) -> Record: ...
    @overload
    def record(self, kind: Literal["input"], body: InputBody) -> Record: ...
    @overload
    def record(self, kind: Literal["output"], body: OutputBody) -> Record: ...
    @overload
    def record(self, kind: Literal["checkpoint"], body: CheckpointBody) -> Record: ...
    @overload
    def record(self, kind: Literal["metric"], body: MetricBody) -> Record: ...
    @overload
    def record(self, kind: Literal["eval"], body: EvalBody) -> Record: ...
    @overload
    def record(self, kind: Literal["run.finished"], body: RunFinished) -> Record: ...
    @overload
    def record(self, kind: Literal["verification"], body: VerificationBody) -> Record: ...
    @overload
    def record(self, kind: Literal["publication"], body: PublicationBody) -> Record: ...
    @overload
    def record(self, kind: Literal["trial"], body: TrialBody) -> Record: ...
    @overload
    def record(self, kind: Literal["selection"], body: SelectionBody) -> Record: ...

    def record(self, kind: Kind, body: Mapping[str, Any]) -> Record:
        """Append a record of ``kind``; its body is that kind's TypedDict (:data:`marin.ledger.bodies.BODIES`)."""
        t = time.perf_counter()
        rec = self.file.append(kind, body)
        self.ledger_s += time.perf_counter() - t
        return rec

    def output(self, name: str, path: str | os.PathLike[str], source: str | os.PathLike[str] | None = None,
               tensor_digest: str | None = None, meta: dict[str, Any] | None = None) -> Record:
        """Digest a produced file or directory and record it as ``path``.

        ``source``: where the bytes are now, when the stage records an output before moving it
        into place (record, then publish: a ledger that cannot take the record leaves the
        previous output where it was)."""
        t = time.perf_counter()
        p = self.root / path
        d = hashing.digest_path(Path(source) if source is not None else p, self.hashes)
        body: OutputBody = {"name": name, "path": relpath(self.root, p), "digest": d.digest, "size": d.size,
                            "type": "file" if d.entries is None else "dir", "dvc_md5": d.dvc_md5}
        if d.entries is not None:
            entries = [{"path": r, "digest": h, "size": n} for r, h, n in d.entries]
            body["files"] = len(entries)
            if len(entries) <= MAX_ENTRIES:  # lets `ledger check` name the changed file
                body["entries"] = entries
            else:  # any number of files stays named, in a listing committed with the ledger
                body["listing"] = listing.write(self.root, entries, d.digest)
        if tensor_digest is not None:  # a model's digest over its tensors
            body["tensor_digest"] = tensor_digest
        if meta is not None:
            body["meta"] = meta
        self.ledger_s += time.perf_counter() - t
        rec = self.record("output", body)
        self._outputs.append({"name": name, "digest": body["digest"]})
        return rec

    def finish(self, status: Literal["succeeded", "failed"] = "succeeded", error: str | None = None) -> Record:
        """Append ``run.finished`` with the Merkle root over every earlier record."""
        t = time.perf_counter()

        def body(records: int, root: bytes) -> RunFinished:
            b: RunFinished = {
                "status": status, "outputs": self._outputs, "merkle_root": hashing.fmt(root),
                "records": records, "wall_s": round(time.perf_counter() - self.t0, 6),
                "ledger_s": round(self.ledger_s + time.perf_counter() - t, 6), "cpu_s": process_cpu_s(),
            }
            if error:
                b["error"] = error[:2000]
            return b

        return self.file.append("run.finished", body)

    def __enter__(self) -> Run:
        return self

    def close(self) -> None:
        """Close the file-hash cache (the index it opened); a closed run's later digests read the files."""
        self.hashes.close()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if et is None:
                self.finish("succeeded")
            elif issubclass(et, Exception):  # Ctrl-C (KeyboardInterrupt) leaves the run unfinished, as a kill does:
                with contextlib.suppress(LedgerError):  # the ledger's disk failed too: report the first error
                    self.finish("failed", f"{et.__name__}: {ev}")  # a train or sft run then resumes where it was
        finally:
            self.close()
