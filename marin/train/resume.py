"""Where a training run starts: plan it, then resume an unfinished run of the same recipe (in
the same ledger run, from its last good checkpoint) or begin a new one.

Process 0 alone reads and writes the ledger; the others learn the run and the recorded
checkpoints from it (a collective), and every process restores the same checkpoint.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import jax

from marin import env, hashing, stages
from marin.config import Params, flatten
from marin.errors import StageError
from marin.ledger import Recipe, Run
from marin.ledger.bodies import StoredCheckpoint
from marin.ledger.index import Index
from marin.ledger.run import Plan
from marin.ledger.store import RunLog, load_run
from marin.train import checkpoint, distributed, runtime, seeds, stored
from marin.train.hooks import CKPT, Values
from marin.train.job import Begun, Job, Setup
from marin.train.step import TrainState


def find_resumable(root: Path, recipe: str, stage: str = "train") -> RunLog | None:
    """The latest unfinished run of ``stage`` with this recipe, if any (looked up in the ledger index)."""
    idx = Index.open(root)
    try:
        found = idx.unfinished(stage, recipe)
    finally:
        idx.close()
    for run_id in reversed(found):  # the index is derived: confirm against the run file itself
        log = load_run(root, run_id)
        started = log.bodies("run.started")
        if log.finished is None and started and started[0]["recipe_digest"] == recipe:
            return log
    return None


def last_good_checkpoint(recorded: list[tuple[int, str]], ckpts: checkpoint.Checkpoints, abstract: TrainState,
                         shardings: TrainState, fetch: Callable[[int], bool] | None = None
                         ) -> tuple[int, TrainState] | None:
    """The latest recorded (step, digest) checkpoint that orbax committed (or that ``fetch`` brings
    from the remote it was stored on) and whose tensors still match. Each process looks in the
    folder it has; :func:`agreed` then holds them to one step."""
    committed = set(ckpts.steps())
    for s, digest in reversed(recorded):
        if s not in committed and not (fetch is not None and fetch(s)):
            continue
        if ckpts.solo:  # digested on the host, by this process alone, then placed
            host, _ = ckpts.restore_host(s, abstract)
            if checkpoint.state_digest(host) == digest:
                return s, checkpoint.placed(host, shardings)
        else:
            state, _ = ckpts.restore(s, abstract, shardings)
            if checkpoint.state_digest(state) == digest:
                return s, state
        print(f"checkpoint {s} does not match its record; trying an earlier one")
    return None


def same_as_primary(root: Path, params: Params, job: Job) -> None:
    """Every process has process 0's commit, params and inputs (each host has its own copy of the
    project), or none starts: one line naming each host that differs and in what (a collective)."""
    git = env.code_state(root)
    mine = {"commit": f"{git['git_commit']}{' (dirty)' if git['dirty'] else ''}", "code": git["code_digest"],
            **{f"params {k}": v for k, v in flatten(params.section(*job.sections)).items()},
            **{i.path: hashing.path_digest(root / i.path) if (root / i.path).exists() else "missing"
               for i in job.inputs}}
    every = distributed.allgather_json({"host": socket.gethostname(), "facts": mine})
    want = every[0]["facts"]
    off = [f"process {i} on {e['host']}: {k} {e['facts'].get(k)} (process 0: {want.get(k)})"
           for i, e in enumerate(every) for k in sorted(set(want) | set(e["facts"]))
           if e["facts"].get(k) != want.get(k)]
    if off:
        more = f"; and {len(off) - 3} more" if len(off) > 3 else ""
        raise StageError(f"the hosts' projects differ from process 0's ({'; '.join(off[:3])}{more}); give every host "
                         "the same commit, params.yaml and data (git pull, dvc pull) and rerun")


class Found(TypedDict):
    """The resumable run, as process 0 tells the others: its id, its recorded [step, digest]s, and
    where each was stored for hosts without the files (MARIN_CHECKPOINT_REMOTE)."""

    run_id: str
    ckpts: list[tuple[int, str]]
    stored: dict[str, StoredCheckpoint]  # by step (a JSON key)


def _fetcher(root: Path, found: Found, dest: Path) -> Callable[[int], bool]:
    digests = dict((int(s), str(d)) for s, d in found["ckpts"])

    def fetch(step: int) -> bool:
        where = found["stored"].get(str(step))
        if where is None:
            return False
        print(f"checkpoint {step} of {found['run_id']}: not on this host; fetching it from DVC remote "
              f"{where['remote']}", flush=True)
        stored.fetch(root, found["run_id"], step, digests[step], where, dest / str(step))
        return True
    return fetch


def agreed(start: int) -> None:
    """Every process resumes from the same step, or none does (one line naming who differs)."""
    if jax.process_count() == 1:
        return
    steps = distributed.allgather_json(start)
    if len(set(steps)) > 1:
        hosts = distributed.allgather_json(socket.gethostname())
        where = ", ".join(f"process {i} ({h}): step {s}" for i, (h, s) in enumerate(zip(hosts, steps, strict=True)))
        raise StageError(f"the processes would resume from different checkpoints ({where}); a host lacks a "
                         f"checkpoint the others have: set {stored.ENV} so that every host can fetch it")


def _restore(root: Path, found: Found | None, su: Setup) -> tuple[int, TrainState | None, dict[int, str]]:
    """The step and state to resume from (0 and None: start afresh), and the recorded checkpoints."""
    if found is None:
        return 0, None, {}
    recorded = [(int(s), str(d)) for s, d in found["ckpts"]]  # lists, once through JSON
    ck = checkpoint.Checkpoints(root / CKPT / found["run_id"])
    got = last_good_checkpoint(recorded, ck, su.abstract, su.shardings, _fetcher(root, found, ck.directory))
    ck.close()
    start, state = got if got is not None else (0, None)
    agreed(start)
    return start, state, dict(recorded)


def begin(root: Path, params: Params, topo: distributed.Topology, job: Job) -> tuple[Setup, Begun]:
    """Plan the run; resume an unfinished run of the same recipe, in the same ledger run, or start."""
    rt = params.runtime
    fp = env.fingerprint()
    procs = distributed.allgather_json(distributed.process_entry(fp, topo.coordinator)) if rt.processes > 1 else None
    if procs:
        same_as_primary(root, params, job)
    execution = {"processes": procs, "coordinator": topo.coordinator or "cluster auto-detection"} if procs else None
    plan = prior = su = None
    if topo.primary:
        plan = Plan.make(root, Recipe(
            job.stage, params.section(*job.sections), list(job.inputs), closure=stages.code_files(root, job.stage),
            det_class=runtime.determinism_class(rt, fp), seeds=seeds.record(params.seed, job.streams),
            fingerprint=fp, execution=execution))
        su = job.setup(root, params)  # first, alone: it may build the token cache the others then read
        prior = find_resumable(root, plan.recipe_digest, job.stage)
    found: Found | None = None if prior is None else {
        "run_id": prior.run_id, "ckpts": [(c["step"], c["digest"]) for c in prior.bodies("checkpoint")],
        "stored": {str(c["step"]): c["stored"] for c in prior.bodies("checkpoint") if "stored" in c}}
    if rt.processes > 1:
        found = distributed.from_primary(found)
    su = su or job.setup(root, params)
    start, state, ckpts = _restore(root, found, su)
    metrics: dict[int, Values] = {}
    run = None
    if topo.primary and prior is not None:
        metrics = {m["step"]: m["values"] for m in prior.bodies("metric")}
        stopped = distributed.interruption(root, prior.run_id)
        reason = "unfinished run of the same recipe" + (f"; it had stopped: {stopped}" if stopped else "")
        run = Run.resume(root, prior.run_id, reason=reason, from_step=start,
                         execution=execution)
        if plan is not None and plan.hashes is not None:  # the plan found the run to resume: it begins none
            plan.hashes.close()
        print(f"{job.stage}: resuming {run.run_id} from step {start}")
    elif topo.primary:
        assert plan is not None  # the primary process plans the run
        run = Run.begin(plan)
    if rt.processes > 1:
        run_id = distributed.from_primary(run.run_id if run else None)
    else:
        assert run is not None  # one process is the primary
        run_id = run.run_id
    if procs:  # each host's launcher names a peer that is gone from it
        distributed.write_peers(root, procs, run_id)
    if state is None:
        state = su.init_state(params)
    return su, Begun(run, run_id, state, metrics, ckpts)
