"""Clock checks of ``marin ledger check``: record times that go backwards, lie in the future,
or predate what the run read (step 9), and runs backdated before a snapshot (step 8b).

A run's chain, for the clock, is the runs whose outputs it read: an input record names a path
and digest, and the runs that recorded an output of that path and digest are its producers.
A run cannot start before the earliest producer recorded that output, nor a record precede the
record before it in the same run file, nor any record lie ahead of now, by more than
``ledger.clock_skew_s`` (machines' clocks differ a little; a year back or a day ahead is a clock
set wrong, or a run forged with a shifted clock).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from marin.ledger.records import Record

SKEW_S = 300.0  # the default of ledger.clock_skew_s


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

    skew_s: float = SKEW_S
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    latest: tuple[int, str] | None = None  # (seq, time) of the latest record so far
    back: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, time, the latest time before it)
    inputs: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, path, digest) of input records

    _at: dt.datetime | None = None  # the latest time, parsed (each record's time is parsed once)

    def feed(self, r: Record) -> None:
        t = parse(r.time)
        if self.latest is not None and self._at is not None and (self._at - t).total_seconds() > self.skew_s:
            self.back.append((r.seq, r.time, self.latest[1]))
        if self._at is None or t > self._at:
            self.latest, self._at = (r.seq, r.time), t
        if r.kind == "input" and isinstance(r.body.get("path"), str):
            self.inputs.append((r.seq, r.body["path"], str(r.body.get("digest"))))

    def problems(self, name: str) -> list[tuple[str, str]]:
        """(where, what) for records earlier than the record before them, and the latest record if in the future."""
        out = [(f"{name} seq {seq}", f"dated {t}, {behind(before, t, 0):.0f} s before an earlier record of the run "
                                     f"({before}; ledger.clock_skew_s is {self.skew_s:g}): the clock went back")
               for seq, t, before in self.back]
        if self.latest is not None and (lead := ahead(self.latest[1], self.now, self.skew_s)) is not None:
            out.append((f"{name} seq {self.latest[0]}", f"dated {self.latest[1]}, {lead:.0f} s in the future "
                                                        f"(ledger.clock_skew_s is {self.skew_s:g}): a clock set ahead"))
        return out


def check_chain(runs: list[_Run], skew_s: float) -> list[tuple[str, str]]:
    """Step 9: each run's own clock, and its start against the producers of what it read."""
    produced: dict[tuple[str, str], list[tuple[str, _Run, int]]] = defaultdict(list)
    for rc in runs:
        for r in rc.outputs:
            produced[(r.body["path"], r.body["digest"])].append((r.time, rc, r.seq))
    out = []
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
    """The earliest recording of an output by a run other than ``rc`` (a rerun may record the same bytes again)."""
    others = [p for p in made if p[1] is not rc]
    return [min(others, key=lambda p: parse(p[0]))] if others else []


def backdated(head_time: str | None, known: set[str], runs: list[_Run], skew_s: float) -> list[tuple[str, str]]:
    """Step 8b: a run the snapshot does not hold, dated before the snapshot's head, was added since
    with its clock set back (history grows forward)."""
    if not head_time:
        return []
    return [(f"{rc.name} seq 0", f"not in the snapshot, yet started {rc.started_time}, {lag:.0f} s before the "
                                 f"snapshot's head ({head_time}; ledger.clock_skew_s is {skew_s:g}): "
                                 "added since, backdated")
            for rc in runs if rc.run_id not in known and rc.started_time
            and (lag := behind(head_time, rc.started_time, skew_s)) is not None]


def head_time(snapshot_time: str | None, watched: list[str]) -> str | None:
    """The snapshot's head time: as it records it, else (an older snapshot) the latest time of its
    runs' records at the seqs it holds, as found in the ledger."""
    if snapshot_time:
        return snapshot_time
    return max(watched, key=parse) if watched else None


def skew_of(root: Path) -> float:
    """``ledger.clock_skew_s`` of the project's params.yaml (the default where it has none)."""
    from marin import config

    path = root / "params.yaml"
    return config.load(path).ledger.clock_skew_s if path.is_file() else SKEW_S
