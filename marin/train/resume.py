"""Where a training run starts: plan it, then resume an unfinished run of the same recipe (in
the same ledger run, from its last good checkpoint) or begin a new one.

Process 0 alone reads and writes the ledger; the others learn the run and the recorded
checkpoints from it (a collective), and every process restores the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from marin import env, stages
from marin.config import Params
from marin.ledger import Recipe, Run
from marin.ledger.index import Index
from marin.ledger.run import Plan
from marin.ledger.store import RunLog, load_run
from marin.train import checkpoint, distributed, runtime, seeds
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
                         shardings: TrainState) -> tuple[int, TrainState] | None:
    """The latest recorded (step, digest) checkpoint that orbax committed and whose tensors
    still match. Every process calls it with the same list (restores are collective)."""
    committed = set(ckpts.steps())
    for s, digest in reversed(recorded):
        if s not in committed:
            continue
        state, _ = ckpts.restore(s, abstract, shardings)
        if checkpoint.state_digest(state) == digest:
            return s, state
        print(f"checkpoint {s} does not match its record; trying an earlier one")
    return None


class Found(TypedDict):
    """The resumable run, as process 0 tells the others: its id and its recorded [step, digest]s."""

    run_id: str
    ckpts: list[tuple[int, str]]


def _restore(root: Path, found: Found | None, su: Setup) -> tuple[int, TrainState | None, dict[int, str]]:
    """The step and state to resume from (0 and None: start afresh), and the recorded checkpoints."""
    if found is None:
        return 0, None, {}
    recorded = [(int(s), str(d)) for s, d in found["ckpts"]]  # lists, once through JSON
    ck = checkpoint.Checkpoints(root / CKPT / found["run_id"])
    got = last_good_checkpoint(recorded, ck, su.abstract, su.shardings)
    ck.close()
    start, state = got if got is not None else (0, None)
    return start, state, dict(recorded)


def begin(root: Path, params: Params, topo: distributed.Topology, job: Job) -> tuple[Setup, Begun]:
    """Plan the run; resume an unfinished run of the same recipe, in the same ledger run, or start."""
    rt = params.runtime
    fp = env.fingerprint()
    procs = distributed.allgather_json(distributed.process_entry(fp)) if rt.processes > 1 else None
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
        "run_id": prior.run_id, "ckpts": [(c["step"], c["digest"]) for c in prior.bodies("checkpoint")]}
    if rt.processes > 1:
        found = distributed.from_primary(found)
    su = su or job.setup(root, params)
    start, state, ckpts = _restore(root, found, su)
    metrics: dict[int, Values] = {}
    run = None
    if topo.primary and prior is not None:
        metrics = {m["step"]: m["values"] for m in prior.bodies("metric")}
        run = Run.resume(root, prior.run_id, reason="unfinished run of the same recipe", from_step=start,
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
    if state is None:
        state = su.init_state(params)
    return su, Begun(run, run_id, state, metrics, ckpts)
