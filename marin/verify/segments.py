"""``marin verify --segments K``: the Proof-of-Learning idea with exact equality.

The N checkpoint intervals of a train run are (0, c1], (c1, c2], ...; K of them are drawn
without replacement by a seeded draw (the seed from ``secrets`` unless the verifier chooses
one; either way it is recorded, with its source). Each drawn interval is replayed from its
starting checkpoint on disk, all in one process, and the exact metrics inside it and the
state digest at its end are compared with the record. One forged interval among N is
caught with probability K/N per verification.
"""

from __future__ import annotations

import random
import secrets
from pathlib import Path
from typing import Any, Protocol

from marin import hashing
from marin.ledger.bodies import RunStarted, Segments
from marin.ledger.index import Index
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.remote import checkpoints_dir
from marin.stages import TRAINING
from marin.verify.compare import Divergence, class_differences, values_divergence
from marin.verify.outcome import Outcome, Say, counts, json_run
from marin.verify.workspace import CannotVerify, Workspace


class Verifier(Protocol):
    """What the segment replay reads of :class:`marin.verify.verifier.Verifier` (steps 1-5 done)."""

    root: Path
    log: RunLog
    index: Index
    out: Outcome
    say: Say
    ws: Workspace
    replay_env: dict[str, str]

    @property
    def started(self) -> RunStarted: ...


def check_segments(root: Path, log: RunLog, k: int, index: Index | None = None) -> None:
    """Before any work: a train (or sft) run, 1 <= K <= N, and its checkpoints on this machine."""
    stage = log.stage
    if stage not in TRAINING:
        raise CannotVerify(f"--segments replays checkpoint intervals of a train or sft run; {log.run_id} is {stage}")
    processes = log.params.get("runtime", {}).get("processes", 1)
    if processes > 1:  # its bits are those of its process topology (docs/architecture.md), not one process's
        raise CannotVerify(f"--segments replays intervals in one process; run {log.run_id} trained on {processes} "
                           "processes, whose bits differ from one process's: verify it with a full replay")
    ckpts = log.of_kind("checkpoint")
    if not 1 <= k <= len(ckpts):
        raise CannotVerify(f"--segments {k}: run {log.run_id} has {len(ckpts)} checkpoint intervals; "
                           f"choose 1..{len(ckpts)}")
    where = checkpoints_dir(root, log, index)  # the project's, else those `marin publish` stored, fetched by digest
    if not where.is_dir():
        raise CannotVerify(f"--segments needs the run's checkpoints, and {where} is not on this machine "
                           "(checkpoints are not DVC outputs) and no `marin publish` recorded them; copy them "
                           "here, or verify with a full replay")


def stage_args(stage: str) -> list[str]:
    """The replay tool's ``--stage`` for a fine-tune; none for train (a commit before sft has no such flag)."""
    return [] if stage == "train" else ["--stage", stage]


def draw(seed: int, n: int, k: int) -> list[int]:
    """The intervals (0-based) a seeded draw picks: k of n without replacement."""
    return sorted(random.Random(seed).sample(range(n), k))


def replay_segments(v: Verifier, k: int, seed: int | None) -> None:
    """Steps 6-7 with --segments: draw, replay in ``v``'s workspace, compare (see the module docstring)."""
    log, out, say, started = v.log, v.out, v.say, v.started
    ckpts = sorted(log.of_kind("checkpoint"), key=_step)
    n = len(ckpts)
    source = "random" if seed is None else "chosen by the verifier"
    seed = secrets.randbits(32) if seed is None else seed
    bounds = [(_step(ckpts[i - 1]) if i else 0, _step(ckpts[i])) for i in draw(seed, n, k)]
    out.segments = Segments(seed=seed, seed_source=source, k=k, n=n, drawn=[list(b) for b in bounds],
                            detection_probability=round(k / n, 6))
    say(f"  6. replay: {k} of {n} checkpoint intervals, seed {seed} ({source}): {bounds}")
    ckpt_dir = checkpoints_dir(v.root, log, v.index)
    res_all = json_run(v.ws, v.replay_env, ["segments", "--checkpoints", str(ckpt_dir), "--intervals",
                                            ",".join(f"{a}:{b}" for a, b in bounds), *stage_args(out.stage)], out)
    # What ran: the recorded code and params (as the full replay's own run.started shows them).
    if res_all["code_digest"] != started["code"]["code_digest"] or res_all["params"] != started["params"]:
        raise CannotVerify("step 6: the segment replay did not run the recorded code and params "
                           f"(code {res_all['code_digest']}, recorded {started['code']['code_digest']})")
    metrics = {r.body_as("metric")["step"]: r for r in log.of_kind("metric")}
    at = {_step(r): r for r in ckpts}
    for res in res_all["intervals"]:
        before = len(out.divergences)
        _compare_interval(res, at, metrics, out)
        _end_files(ckpt_dir, at[res["end"]], out)
        ok = len(out.divergences) == before
        say(f"     interval ({res['start']}, {res['end']}]: {'ok' if ok else 'MISMATCH'}")
    det = res_all["determinism_class"]
    out.verifier.update(env=res_all["env"], code=started["code"], determinism_class=det)
    out.class_diffs = class_differences(started["determinism_class"], det)
    say(f"  7. compared {sum(out.compared.values())} records ({counts(out.compared)})")


def _step(r: Record) -> int:
    return r.body_as("checkpoint")["step"]


def _end_files(ckpt_dir: Path, r: Record, out: Outcome) -> None:
    """The interval's end checkpoint on disk against its record's files digest (the replay compared its state with
    the record, not with these files, which a resume or a later interval restores from)."""
    b = r.body_as("checkpoint")
    where = ckpt_dir / Path(b["path"]).name
    if "files_digest" not in b or not where.is_dir():
        return
    now = hashing.path_digest(where)
    if now != b["files_digest"]:
        out.divergences.append(Divergence(r.seq, "checkpoint", f"the checkpoint files at {b['path']} hash to "
                                          f"{now}, not the recorded {b['files_digest']} (changed on disk)",
                                          step=b["step"], recorded=b["files_digest"], replayed=now,
                                          independent=True))


def _compare_interval(res: dict[str, Any], at: dict[int, Record], metrics: dict[int, Record], out: Outcome) -> None:
    start, end = res["start"], res["end"]
    if res.get("missing") is not None:
        raise CannotVerify(f"step 6: the recorded checkpoint at step {start} is not on disk "
                           f"({at[start].body_as('checkpoint')['path']}); copy the run's checkpoints here or use a "
                           "full replay")
    if start and res["start_digest"] != at[start].body_as("checkpoint")["digest"]:
        r, b = at[start], at[start].body_as("checkpoint")
        out.divergences.append(Divergence(r.seq, "checkpoint", f"the checkpoint files at {b['path']} restore "
                               f"to {res['start_digest']}, not the recorded {b['digest']}: the interval "
                               "cannot start", step=start, recorded=b["digest"],
                               replayed=res["start_digest"], independent=True))
        return
    for s, values in res["metrics"].items():
        r = metrics.get(int(s))
        out.compared["metric"] = out.compared.get("metric", 0) + 1
        if r is None:
            out.divergences.append(Divergence(at[end].seq, "metric", "the replay logs this step; the run "
                                              "recorded no metric for it", step=int(s), replayed=values,
                                              independent=True))
            continue
        if r.body_as("metric")["values"] != values:
            out.divergences.append(values_divergence(r, values))
    r = at[end]
    recorded = r.body_as("checkpoint")["digest"]
    out.compared["checkpoint"] = out.compared.get("checkpoint", 0) + 1
    if res["end_digest"] != recorded:
        dist: dict[str, Any] = res["distances"] or {}
        first = next(iter(sorted(dist)), None)
        what = f"replaying steps {start}..{end} gives {res['end_digest']}, recorded {recorded}"
        if first is not None:
            what += f"; first tensor differing from the files on disk: {first}"
        out.divergences.append(Divergence(r.seq, "checkpoint", what, step=end, tensor=first,
                                          recorded=recorded, replayed=res["end_digest"]))
