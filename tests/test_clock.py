"""Clock skew: runs forged with a shifted clock (a valid hash chain, times moved) fail `marin ledger check`
(issue 38, defect 8); times within ``ledger.clock_skew_s`` pass."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from marin.ledger import clock
from tests.conftest import Project
from tests.test_verify import rewrite_chain

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


# -- the pure comparisons ----------------------------------------------------------------


def test_behind_counts_only_beyond_the_skew() -> None:
    assert clock.behind("2026-06-01T12:00:00.000000Z", "2026-06-01T11:56:00.000000Z", 300) is None
    assert clock.behind("2026-06-01T12:00:00.000000Z", "2026-06-01T11:54:00.000000Z", 300) == 360
    assert clock.behind("2026-06-01T12:00:00Z", "2026-06-01T12:10:00Z", 0) is None  # later is not behind


def test_ahead_counts_only_beyond_the_skew() -> None:
    assert clock.ahead("2026-06-01T12:04:59Z", NOW, 300) is None
    assert clock.ahead("2026-06-02T12:00:00Z", NOW, 300) == 86400


def test_a_record_going_back_and_one_in_the_future_are_named() -> None:
    c = clock.Clock(300, NOW)
    for seq, t in enumerate(("2026-06-01T10:00:00Z", "2026-06-01T09:58:00Z", "2026-06-01T09:00:00Z",
                             "2026-06-02T10:00:00Z")):
        c.feed(_Rec(seq, t))
    where = [w for w, _ in c.problems("r.jsonl")]
    assert where == ["r.jsonl seq 2", "r.jsonl seq 3"]
    assert "the clock went back" in c.problems("r.jsonl")[0][1]
    assert "in the future" in c.problems("r.jsonl")[1][1]


def _proc(i: int, host: str, t: str) -> dict:
    return {"process_id": i, "host": host, "ip": f"10.1.2.{i + 2}", "clock": t}


@pytest.mark.parametrize("clocks, off", [
    (["2026-06-01T12:00:00Z", "2026-06-01T13:00:00Z"], [(1, 3600.0)]),  # an hour ahead (faketime +1h)
    (["2026-06-01T12:00:00Z", "2026-06-01T11:50:00Z"], [(1, -600.0)]),  # behind
    (["2026-06-01T12:00:00Z", "2026-06-01T12:04:59Z"], []),  # within the skew
    (["2026-06-01T12:00:00Z", "2026-06-01T12:00:01Z", "2026-06-01T14:00:00Z"], [(2, 7200.0)]),
    (["2026-06-01T12:00:00Z"], []),  # one process: nothing to compare
])
def test_a_host_whose_clock_is_off_process_0s_is_named(clocks: list[str], off: list[tuple[int, float]]) -> None:
    procs = [_proc(i, f"host-{'abc'[i]}", t) for i, t in enumerate(clocks)]
    found = clock.processes_off({"execution": {"processes": procs}}, 300)
    assert [(p["process_id"], o) for p, o in found] == off
    rec = _Rec(0, "2026-06-01T12:00:00Z")
    rec.kind, rec.body = "run.started", {"execution": {"processes": procs}}
    c = clock.Clock(300, NOW)
    c.feed(rec)
    lines = [what for _, what in c.problems("r.jsonl")]
    assert len(lines) == len(off)
    for (i, o), line in zip(off, lines, strict=True):
        assert line.startswith(f"process {i} on host-{'abc'[i]} (10.1.2.{i + 2}): its clock read")
        assert f"{o:+.0f} s" in line


def test_head_time_is_the_latest_of_the_snapshots_own_and_the_records_it_holds() -> None:
    assert clock.head_time("2026-06-01T12:00:00Z", ["2027-01-01T00:00:00Z"]) == "2027-01-01T00:00:00Z"
    assert clock.head_time("2026-06-01T12:00:00Z", ["2026-01-01T00:00:00Z"]) == "2026-06-01T12:00:00Z"
    assert clock.head_time(None, ["2026-06-01T12:00:00Z", "2026-06-01T13:00:00Z"]) == "2026-06-01T13:00:00Z"
    assert clock.head_time(None, []) is None


class _Rec:
    kind, body = "metric", {}

    def __init__(self, seq: int, time: str):
        self.seq, self.time = seq, time


class _Run:
    def __init__(self, run_id: str, since_seq: int, times: list[str]):
        self.name, self.run_id, self.started_time, self.outputs = f"{run_id}.jsonl", run_id, times[0], []
        self.clock = clock.Clock(300, NOW, since_seq)
        for seq, t in enumerate(times):
            self.clock.feed(_Rec(seq, t))


def test_records_appended_to_a_held_run_dated_before_the_head_are_backdated() -> None:
    """A killed run the snapshot holds up to seq 1, then an end (or a verification) appended dated before the
    snapshot's head: the earliest such record is named; a run appended to after the head passes."""
    head = "2026-06-01T12:00:00Z"
    late = _Run("late", 1, ["2026-06-01T09:00:00Z", "2026-06-01T09:01:00Z", "2026-06-01T09:30:00Z",
                            "2026-06-01T09:20:00Z"])
    fine = _Run("fine", 1, ["2026-06-01T09:00:00Z", "2026-06-01T09:01:00Z", "2026-06-01T12:30:00Z"])
    new = _Run("new", -1, ["2026-06-01T11:00:00Z"])
    got = clock.backdated(head, {"late", "fine"}, [late, fine, new], 300)
    assert [w for w, _ in got] == ["late.jsonl seq 3", "new.jsonl seq 0"]
    assert "appended after the snapshot, which holds the run up to seq 1" in got[0][1]
    assert "not in the snapshot" in got[1][1]


# -- forged runs, checked by the command ------------------------------------------------


def shifted(recs: list[dict], by: dt.timedelta) -> list[dict]:
    for r in recs:
        t = dt.datetime.fromisoformat(r["time"]) + by
        r["time"] = t.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return recs


def run_path(proj: Project, stage: str) -> Path:
    return proj.root / "ledger" / "runs" / f"{proj.runs(stage)[-1][0]['run_id']}.jsonl"


def fails_naming(p, name: str, what: str) -> None:
    assert p.returncode == 1, p.stdout + p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith(f"FAIL {name}") and what in x]
    assert len(lines) == 1, p.stderr


def test_a_run_dated_a_year_back_after_a_snapshot_is_refused_by_since(data_project: Project) -> None:
    proj = data_project
    (proj.root / "head.json").write_text(proj.marin("ledger", "head", "--json", check=True).stdout)
    recs = proj.runs("fetch")[-1]
    new_id = recs[0]["run_id"][:-8] + "0badc10c"
    for r in recs:
        r["run_id"] = new_id
    rewrite_chain(proj.root / "ledger" / "runs" / f"{new_id}.jsonl", shifted(recs, -dt.timedelta(days=365)))
    assert "backdated" not in proj.marin("ledger", "check").stderr  # without a snapshot, no head to predate
    p = proj.marin("ledger", "check", "--since", "head.json")
    fails_naming(p, f"{new_id}.jsonl seq 0", "before the snapshot's head")
    old = json.loads((proj.root / "head.json").read_text())
    del old["time"]  # an older snapshot: its head time is found from its runs' records in the ledger
    (proj.root / "old.json").write_text(json.dumps(old))
    fails_naming(proj.marin("ledger", "check", "--since", "old.json"), f"{new_id}.jsonl seq 0", "snapshot's head")


def test_a_run_dated_a_day_ahead_is_in_the_future(data_project: Project) -> None:
    path = run_path(data_project, "tokenize")
    rewrite_chain(path, shifted(data_project.runs("tokenize")[-1], dt.timedelta(days=1)))
    fails_naming(data_project.marin("ledger", "check"), path.name, "in the future")


def _start_before_input(proj: Project, seconds: float) -> Path:
    """The tokenize run moved to start ``seconds`` before curate recorded the split it read."""
    curated = {(r["body"]["path"], r["body"]["digest"]): r["time"]
               for r in proj.runs("curate")[-1] if r["kind"] == "output"}
    recs = proj.runs("tokenize")[-1]
    read = min((curated[(r["body"]["path"], r["body"]["digest"])] for r in recs
                if r["kind"] == "input" and (r["body"]["path"], r["body"]["digest"]) in curated),
               key=clock.parse)
    by = clock.parse(read) - clock.parse(recs[0]["time"]) - dt.timedelta(seconds=seconds)
    path = run_path(proj, "tokenize")
    rewrite_chain(path, shifted(recs, by))
    return path


def test_a_run_starting_before_its_input_was_recorded_is_flagged(data_project: Project) -> None:
    path = _start_before_input(data_project, 3600)
    fails_naming(data_project.marin("ledger", "check"), f"{path.name} seq 0", "before its input")


def test_a_start_within_the_skew_passes_and_the_skew_is_a_param(data_project: Project) -> None:
    _start_before_input(data_project, 60)
    p = data_project.marin("ledger", "check")
    assert p.returncode == 0, p.stdout + p.stderr
    data_project.write_params({**data_project.params, "ledger": {"clock_skew_s": 10}})
    assert data_project.marin("ledger", "check").returncode == 1


def test_a_record_appended_to_a_killed_run_of_the_snapshot_dated_before_its_head_is_refused(
        data_project: Project) -> None:
    """The audit's repro: a killed run (no outputs, no end) is in the snapshot; its outputs and run.finished
    are appended later, dated an hour before the snapshot's head (after the run's own records, so its clock
    never goes back): `--since` names the first appended record, a plain check cannot tell."""
    proj = data_project
    recs = shifted([r for r in proj.runs("fetch")[-1] if r["kind"] != "input"], -dt.timedelta(hours=1))
    new_id = recs[0]["run_id"][:-8] + "0badc10c"
    for seq, r in enumerate(recs):  # no inputs: an hour back is then no earlier than anything it read
        r["run_id"], r["seq"] = new_id, seq
    recs[-1]["body"]["records"] = recs[-1]["seq"]
    path = proj.root / "ledger" / "runs" / f"{new_id}.jsonl"
    cut = next(i for i, r in enumerate(recs) if r["kind"] == "output")
    rewrite_chain(path, recs[:cut])  # killed before its outputs
    (proj.root / "head.json").write_text(proj.marin("ledger", "head", "--json", check=True).stdout)
    rewrite_chain(path, recs)  # the same first records, then the rest appended
    assert proj.marin("ledger", "check").returncode == 0
    p = proj.marin("ledger", "check", "--since", "head.json")
    fails_naming(p, f"{new_id}.jsonl seq {cut}", "appended after the snapshot")
    assert "before the snapshot's head" in p.stderr


def test_a_snapshot_whose_time_is_not_a_time_is_refused(data_project: Project) -> None:
    """Garbage parsed as the epoch would disable the backdating check: the snapshot is refused in one line."""
    snap = json.loads(data_project.marin("ledger", "head", "--json", check=True).stdout)
    snap["time"] = "yesterday-ish"  # outside the root: the root still matches
    (data_project.root / "bad.json").write_text(json.dumps(snap))
    p = data_project.marin("ledger", "check", "--since", "bad.json")
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("marin: error: bad.json: not a ledger snapshot (time is 'yesterday-ish', not an "
                               "ISO 8601 time)"), p.stderr


def test_the_reader_sets_the_skew_not_the_checked_projects_params(data_project: Project) -> None:
    """A project's own params.yaml allowing a day of skew does not bind its auditor: --clock-skew-s wins."""
    _start_before_input(data_project, 3600)
    data_project.write_params({**data_project.params, "ledger": {"clock_skew_s": 86400}})
    assert data_project.marin("ledger", "check").returncode == 0
    fails_naming(data_project.marin("ledger", "check", "--clock-skew-s", "300"), "", "before its input")
    p = data_project.marin("ledger", "check", "--clock-skew-s", "-1")
    assert p.returncode == 2 and "not a number of seconds" in p.stderr


def test_problems_for_checks_runs_read_into_memory(data_project: Project) -> None:
    """What `marin report verify` calls for the runs behind a report: the same step 9 lines as ledger check."""
    from marin.ledger.store import read_run

    path = _start_before_input(data_project, 3600)
    logs = [read_run(p, validate=False) for p in sorted(path.parent.glob("*.jsonl"))]
    got = clock.problems_for(logs, 300)
    assert len(got) == 1 and got[0].startswith(f"{path.name} seq 0: started ") and "before its input" in got[0]
    assert clock.problems_for(logs, 7200) == []
