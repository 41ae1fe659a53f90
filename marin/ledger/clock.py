"""Clock checks of ``marin ledger check``: record times that go backwards, lie in the future,
or predate what the run read (step 9), and records backdated before a snapshot (step 8b): a run the
snapshot does not hold, or a record appended to one it holds after the seq it holds.

A run's chain, for the clock, is the runs of other stages whose outputs it read: an input record
names a path and digest, and the runs of another stage that recorded an output of that path and
digest are its producers.
A run cannot start before the earliest producer recorded that output, nor a record precede the
record before it in the same run file, nor any record lie ahead of now, by more than
``ledger.clock_skew_s`` (machines' clocks differ a little; a year back or a day ahead is a clock
set wrong, or a run forged with a shifted clock). The skew is the reader's to choose: ``marin ledger
check --clock-skew-s S`` overrides the checked project's own params.yaml, which its author wrote; either
way the caller passes it in (:func:`marin.config.clock_skew_s`): the ledger reads no params.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from marin.ledger.records import Record
    from marin.ledger.store import RunLog


class _Run(Protocol):
    name: str
    run_id: str
    started_time: str
    outputs: list[Record]
    clock: Clock


def parse(t: str) -> dt.datetime:
    """A record time (ISO 8601, UTC with ``Z``) as an aware datetime; an unreadable one as the epoch
    (the schema check names it)."""
    try:
        d = dt.datetime.fromisoformat(t)
    except (TypeError, ValueError):
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return d if d.tzinfo is not None else d.replace(tzinfo=dt.UTC)


def behind(earlier: str, later: str, skew_s: float) -> float | None:
    """Seconds by which ``later`` precedes ``earlier``, when that is more than ``skew_s``; else None."""
    lag = (parse(earlier) - parse(later)).total_seconds()
    return lag if lag > skew_s else None


def ahead(t: str, now: dt.datetime, skew_s: float) -> float | None:
    """Seconds by which ``t`` lies ahead of ``now``, when that is more than ``skew_s``; else None."""
    lead = (parse(t) - now).total_seconds()
    return lead if lead > skew_s else None


@dataclass
class Clock:
    """What the clock checks keep of one run, fed a record at a time (constant memory but for inputs)."""

    skew_s: float  # ledger.clock_skew_s
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    since_seq: int = -1  # the seq a snapshot holds of the run (-1: none): records after it were added since
    first_after: tuple[int, str] | None = None  # (seq, time) of the earliest-dated record after ``since_seq``
    latest: tuple[int, str] | None = None  # (seq, time) of the latest record so far
    back: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, time, the latest time before it)
    inputs: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, path, digest) of input records
    hosts: list[tuple[int, dict[str, Any], float]] = field(default_factory=list)  # (seq, process, s off process 0)

    _at: dt.datetime | None = None  # the latest time, parsed (each record's time is parsed once)
    _first_at: dt.datetime | None = None  # the time of ``first_after``, parsed

    def feed(self, r: Record) -> None:
        t = parse(r.time)
        if self.latest is not None and self._at is not None and (self._at - t).total_seconds() > self.skew_s:
            self.back.append((r.seq, r.time, self.latest[1]))
        if self._at is None or t > self._at:
            self.latest, self._at = (r.seq, r.time), t
        if r.seq > self.since_seq and (self._first_at is None or t < self._first_at):
            self.first_after, self._first_at = (r.seq, r.time), t
        if r.kind == "input" and isinstance(r.body.get("path"), str):
            self.inputs.append((r.seq, r.body["path"], str(r.body.get("digest"))))
        if r.kind in ("run.started", "run.resumed"):
            self.hosts += [(r.seq, p, off) for p, off in processes_off(r.body, self.skew_s)]

    def problems(self, name: str) -> list[tuple[str, str]]:
        """(where, what) for records earlier than the record before them, and the latest record if in the future."""
        out = [(f"{name} seq {seq}", f"dated {t}, {behind(before, t, 0):.0f} s before an earlier record of the run "
                                     f"({before}; ledger.clock_skew_s is {self.skew_s:g}): the clock went back")
               for seq, t, before in self.back]
        out += [(f"{name} seq {seq}", f"process {p.get('process_id')} on {p.get('host')} ({p.get('ip')}): its clock "
                                      f"read {p.get('clock')}, {off:+.0f} s off process 0's (ledger.clock_skew_s is "
                                      f"{self.skew_s:g}): that host's clock is set wrong")
                for seq, p, off in self.hosts]
        if self.latest is not None and (lead := ahead(self.latest[1], self.now, self.skew_s)) is not None:
            out.append((f"{name} seq {self.latest[0]}", f"dated {self.latest[1]}, {lead:.0f} s in the future "
                                                        f"(ledger.clock_skew_s is {self.skew_s:g}): a clock set ahead"))
        return out


def processes_off(body: dict[str, Any], skew_s: float) -> list[tuple[dict[str, Any], float]]:
    """The processes of a multi-process run (``execution.processes``, each with the clock it read as
    the run started) whose clock is more than ``skew_s`` off process 0's, with the seconds off."""
    execution = body.get("execution")
    procs = cast("dict[str, Any]", execution).get("processes") if isinstance(execution, dict) else None
    entries = [cast("dict[str, Any]", p) for p in cast("list[Any]", procs)] if isinstance(procs, list) else []
    clocks = [(p, str(p["clock"])) for p in entries if isinstance(p.get("clock"), str)]
    if len(clocks) < 2:
        return []
    t0 = parse(clocks[0][1])
    return [(p, off) for p, t in clocks[1:] if abs(off := (parse(t) - t0).total_seconds()) > skew_s]


def check_chain(runs: Sequence[_Run], skew_s: float) -> list[tuple[str, str]]:
    """Step 9: each run's own clock, and its start against the producers of what it read."""
    produced: dict[tuple[str, str], list[tuple[str, _Run, int]]] = defaultdict(list)
    for rc in runs:
        for r in rc.outputs:
            produced[(r.body["path"], r.body["digest"])].append((r.time, rc, r.seq))
    out: list[tuple[str, str]] = []
    for rc in runs:
        out.extend(rc.clock.problems(rc.name))
        worst = max(((lag, seq, path, src) for seq, path, digest in rc.clock.inputs if rc.started_time
                     for src in _first(produced.get((path, digest), ()), rc)
                     if (lag := behind(src[0], rc.started_time, skew_s)) is not None), default=None,
                    key=lambda x: x[0])
        if worst is not None:  # one line per run: the input it started furthest ahead of
            lag, seq, path, (t, src, src_seq) = worst
            out.append((f"{rc.name} seq 0", f"started {rc.started_time}, {lag:.0f} s before its input {path} "
                                            f"(seq {seq}) was recorded by {src.name} seq {src_seq} at {t} "
                                            f"(ledger.clock_skew_s is {skew_s:g}): a clock set back, or a run "
                                            "forged with an earlier date"))
    return out


def _first(made: Iterable[tuple[str, _Run, int]], rc: _Run) -> list[tuple[str, _Run, int]]:
    """The earliest recording of an output by a run of another stage than ``rc``'s: an upstream run.
    A run of the same stage is no producer of it (a rerun records the same bytes again, and a fetch
    reads the archive a later fetch records)."""
    others = [p for p in made if stage_of(p[1].run_id) != stage_of(rc.run_id)]
    return [min(others, key=lambda p: parse(p[0]))] if others else []


def stage_of(run_id: str) -> str:
    """The stage a run id names (``<stage>-<UTC time>-<random hex>``)."""
    return run_id.rsplit("-", 2)[0]


def backdated(head_time: str | None, known: set[str], runs: Sequence[_Run], skew_s: float) -> list[tuple[str, str]]:
    """Step 8b: a record added since the snapshot (of a run it does not hold, or after the seq it holds
    of one it does) dated before the snapshot's head was added with its clock set back (history grows
    forward). One line per run: its earliest-dated such record."""
    if not head_time:
        return []
    out: list[tuple[str, str]] = []
    for rc in runs:
        if rc.clock.first_after is None:
            continue
        seq, t = rc.clock.first_after
        if (lag := behind(head_time, t, skew_s)) is None:
            continue
        held = "not in the snapshot" if rc.run_id not in known else \
            f"appended after the snapshot, which holds the run up to seq {rc.clock.since_seq}"
        out.append((f"{rc.name} seq {seq}", f"{held}, yet dated {t}, {lag:.0f} s before the snapshot's head "
                                            f"({head_time}; ledger.clock_skew_s is {skew_s:g}): added since, "
                                            "backdated"))
    return out


def head_time(snapshot_time: str | None, watched: list[str]) -> str | None:
    """The snapshot's head time: the latest of the time it records (older snapshots have none) and the
    times of its runs' records at the seqs it holds, as found in the ledger (a run in progress when the
    snapshot was taken may have written after its last start or end)."""
    times = [t for t in (snapshot_time, *watched) if t]
    return max(times, key=parse) if times else None


@dataclass
class _Fed:
    """A run read into memory, as the clock checks see it (:func:`problems_for`)."""

    name: str
    run_id: str
    started_time: str
    outputs: list[Record]
    clock: Clock


class Snapshot(Protocol):
    """What the clock checks read of a ledger head (:class:`marin.ledger.head.Head`)."""

    @property
    def time(self) -> str | None: ...

    @property
    def leaves(self) -> Sequence[Any]: ...  # each with run_id and seq


def problems_for(runs: Iterable[RunLog], skew_s: float, now: dt.datetime | None = None,
                 snapshot: Snapshot | None = None) -> list[str]:
    """Steps 8b and 9 over runs already read (``marin report verify``: the runs behind a report), one
    ``"<run file> seq N: what"`` line each: clocks that went back, records in the future, runs started
    before their inputs were recorded, and, with ``snapshot``, records added since it yet dated before it."""
    now = now or dt.datetime.now(dt.UTC)
    held = {leaf.run_id: leaf.seq for leaf in snapshot.leaves} if snapshot is not None else {}
    fed: list[_Fed] = []
    watched: list[str] = []
    for log in runs:
        c = Clock(skew_s, now, held.get(log.run_id, -1))
        for r in log.records:
            c.feed(r)
            if r.seq == held.get(log.run_id):
                watched.append(r.time)
        started = log.started
        fed.append(_Fed(log.path.name, log.run_id, started.time if started is not None else "",
                        [r for r in log.records if r.kind == "output"], c))
    out = check_chain(fed, skew_s)
    if snapshot is not None:
        out += backdated(head_time(snapshot.time, watched), set(held), fed, skew_s)
    return [f"{where}: {what}" for where, what in out]

