"""A universal run's recorded rounding log, for its replay (marin.train.rounding_log): found on this
machine and handed to the replay, which rounds as it says and stops at a value it does not account for.

The log is looked for beside the run's checkpoints (``checkpoints/<run>/rounding.jsonl``), else in the
released model folder when that file is the one the run's ``model`` output recorded. It is not checked
before the replay: a changed log makes the replay differ, and :func:`explain` then names the changed
entry (from the metric records' log digests and the checkpoint's first differing tensor and index)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from marin import hashing, readers
from marin.ledger.index import Index
from marin.ledger.store import RunLog
from marin.remote import checkpoints_dir
from marin.train.rounding_log import AGAINST, GRAD, LOG_FILE, OUTPUT, REPLAY_VAR, RoundingError, entries, entry, header
from marin.verify.compare import Divergence
from marin.verify.outcome import Outcome
from marin.verify.workspace import CannotVerify


def replay_env(root: Path, log: RunLog, index: Index) -> dict[str, str]:
    """The variables a replay of ``log`` needs beyond its determinism class: the rounding log of a
    universal run (none for another profile)."""
    if log.start_body["determinism_class"].get("profile") != "universal":
        return {}
    return {REPLAY_VAR: str(recorded_log(root, log, index))}


def recorded_log(root: Path, log: RunLog, index: Index) -> Path:
    """Where the run's rounding log is on this machine (a CannotVerify naming both places if nowhere)."""
    beside = checkpoints_dir(root, log, index) / LOG_FILE if log.of_kind("checkpoint") else None
    if beside is not None and beside.is_file():
        return beside
    for rec in log.of_kind("output"):
        body = rec.body_as("output")
        if body["name"] == OUTPUT:  # a scoring stage's own log (marin.evaluate.universal_scoring): not checked
            there = root / body["path"]  # here either; a changed one is named by explain_scoring
            if there.is_file():
                return there
            beside = there
            continue
        want = next((e["digest"] for e in body.get("entries") or [] if e["path"] == LOG_FILE), None)
        there = root / body["path"] / LOG_FILE
        if want is not None and there.is_file() and hashing.file_digest(there) == want:
            return there
    raise CannotVerify(f"step 5: run {log.run_id} was recorded under the universal profile, and its rounding log is "
                       f"not on this machine ({beside or 'no checkpoints'}, nor the {LOG_FILE} its model output "
                       f"recorded); restore the run's checkpoints, model folder or {OUTPUT} output (evals/rounding/) "
                       "and retry")


def explain(out: Outcome, log: RunLog, env: dict[str, str]) -> None:
    """When the rounding log the replay followed is not the one the run recorded (a metric record's
    ``rounding.log_digest`` is not the digest of the file through its step), a divergence before the
    others naming the entry: within that record's steps, the one at the tensor and index where the
    replay's checkpoint first differs (else the window's only entry, else the window)."""
    path = Path(env[REPLAY_VAR]) if REPLAY_VAR in env else None
    recs = [(r, summary) for r in sorted(log.of_kind("metric"), key=lambda r: r.seq)
            if (summary := r.body_as("metric").get("rounding")) is not None]
    if path is None or not recs or not path.is_file():
        return
    try:
        found = list(entries(path))
    except RoundingError as e:
        out.divergences.insert(0, Divergence(recs[0][0].seq, "rounding_log", str(e), independent=True))
        return
    bad = next(((r, sm) for r, sm in recs if _digest_through(found, r.step or 0) != sm["log_digest"]), None)
    if bad is None:
        return
    rec, sm = bad
    first, last = sm["from_step"], rec.step or 0
    at = {(s, t, i): d for s, t, i, d in found if first <= s <= last}
    parts = {(d.step, name, d.index) for d in out.divergences
             if d.kind == "checkpoint" and d.step is not None and d.tensor is not None and d.index is not None
             for name in _sources(d.tensor)}
    named: tuple[int, str, int] | None = next((k for k in at if k in parts), None)
    if named is None and len(at) == 1:
        named = next(iter(at))
    what = (f"the rounding log {path} is not the one the run recorded: through step {last} it hashes to "
            f"{_digest_through(found, last)}, the metric record says {sm['log_digest']}")
    if named is not None:
        step, tensor, index = named
        what += f"; its entry here (direction {at[named]}) was changed"
        if any(d.kind == "checkpoint" and d.index == index for d in out.divergences):
            what += ", and there the replay's state parts from the recorded checkpoint"
    else:
        step, tensor, index = last, None, None
        what += f"; an entry of steps {first}..{last} was changed, added or removed"
    out.divergences.insert(0, Divergence(rec.seq, "rounding_log", what, step=step, tensor=tensor, index=index,
                                         recorded=sm["log_digest"], independent=True))


def _sources(tensor: str) -> tuple[str, ...]:
    """The log's tensors whose rounding decides a checkpoint tensor: itself, and the gradient of the same
    parameter (``.params['embed']...`` and ``.opt_state[1][0].mu['embed']...`` come from ``grad['embed']...``)."""
    at = tensor.find("['")
    return (tensor, GRAD + tensor[at:]) if at >= 0 else (tensor,)


def _digest_through(found: list[tuple[int, str, int, int]], step: int) -> str:
    """The digest of a log's header and its entries through ``step`` (what a metric record names)."""
    h = hashlib.sha256(header())
    for s, t, i, d in found:
        if s <= step:
            h.update(entry(s, t, i, d))
    return "sha256:" + h.hexdigest()


def explain_scoring(out: Outcome, log: RunLog, env: dict[str, str], replay_root: Path) -> None:
    """A scoring stage's (evaluate, evaluate_instruct) changed rounding log: the log the replay followed
    does not hash to the run's ``rounding_log`` output, and the replay (on one machine, whose nearest
    even is the recorder's) names the entries whose direction is not its own nearest even
    (``<log>.against.jsonl``): a divergence before the others naming the first."""
    path = Path(env[REPLAY_VAR]) if REPLAY_VAR in env else None
    rec = next((r for r in log.of_kind("output") if r.body_as("output")["name"] == OUTPUT), None)
    if path is None or rec is None or not path.is_file():
        return
    body = rec.body_as("output")
    found = hashing.file_digest(path)
    if found == body["digest"]:
        return
    what = (f"the rounding log {path} is not the one the run recorded: it hashes to {found}, the run's output "
            f"says {body['digest']}")
    side = (replay_root / body["path"]).with_suffix(AGAINST)
    against = list(entries_of(side)) if side.is_file() else []
    step: int | None = None
    tensor: str | None = None
    index: int | None = None
    if against:
        step, tensor, index, direction = against[0]
        what += f"; its entry here (direction {direction}, against the value's nearest even) was changed"
    else:
        what += "; an entry was added or removed, or changed where the replay's value lies on the midpoint"
    out.divergences.insert(0, Divergence(rec.seq, "rounding_log", what, step=step, tensor=tensor, index=index,
                                         recorded=body["digest"], replayed=found, independent=True))


def entries_of(path: Path) -> list[tuple[int, str, int, int]]:
    """The entries of a headerless list of rounding log entries (a replay's ``.against.jsonl``)."""
    out: list[tuple[int, str, int, int]] = []
    for line in readers.lines(path, "rounding_log", RoundingError):
        e = json.loads(line)
        out.append((int(e["step"]), str(e["tensor"]), int(e["index"]), int(e["direction"])))
    return out
