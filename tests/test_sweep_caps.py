"""Capped sweeps and counts (issue 38, defect 7): a sweep's trials are counted arithmetically
(a grid: the product of its value counts) and refused above ``sweep.max_trials`` before any is
built; the audit's 10,648-trial grid started trial 0, and a 4 x 1000 grid ran out of memory in
31 s printing nothing. Each command is a measured child process (test_bounded's helpers)."""

from __future__ import annotations

import time

import pytest

from marin.commands.sweep import SweepError, trials
from marin.config import SelectRule, SweepParams
from tests.conftest import Project
from tests.test_bounded import ledger_kept, refused, run

KEYS = ("train.lr", "train.weight_decay", "train.beta1", "train.eps")


def _grid(proj: Project, *sizes: int, **extra: int) -> None:
    params = proj.params
    space = [{"param": k, "values": [1e-4 * (i + 1) for i in range(n)]} for k, n in zip(KEYS, sizes, strict=False)]
    params["sweep"] = {"method": "grid", "space": space, "select": {"metric": "bits_per_byte", "goal": "min"}, **extra}
    proj.write_params(params)


@pytest.mark.parametrize("sizes, count", [((22, 22, 22), 10648), ((1000, 1000, 1000, 1000), 10**12)])
def test_a_grid_over_max_trials_is_refused_before_any_trial(project: Project, sizes: tuple[int, ...],
                                                             count: int) -> None:
    project.stage("fetch")
    before = project.ledger_files()
    _grid(project, *sizes)
    shape = " x ".join(map(str, sizes))
    for argv in (("sweep",), ("params", "check")):
        refused(run(project, "-m", "marin.cli", *argv), 2, f"sweep: {count} trials ({shape} grid)",
                "is above sweep.max_trials (100)")
    assert not project.runs("sweep") and not project.git("for-each-ref", "refs/exps/")  # no trial started
    ledger_kept(project, before)


def test_max_trials_is_itself_capped_and_a_grid_at_the_cap_loads(project: Project) -> None:
    _grid(project, 10, 10, max_trials=100)
    child = run(project, "-m", "marin.cli", "params", "check")
    assert child.code == 0, child.stderr
    _grid(project, 10, max_trials=5000)
    refused(run(project, "-m", "marin.cli", "params", "check"), 2, "sweep.max_trials: 5000 is out of range",
            "<= 1000")


def test_random_trials_over_the_cap_and_a_huge_harness_limit_are_refused(project: Project) -> None:
    params = project.params
    params["sweep"] = {"method": "random", "trials": 500, "space": [{"param": "train.lr", "low": 1e-4, "high": 1e-2}],
                       "select": {"metric": "bits_per_byte", "goal": "min"}}
    project.write_params(params)
    refused(run(project, "-m", "marin.cli", "params", "check"), 2, "sweep: 500 trials (random)", "sweep.max_trials")
    del params["sweep"]
    params["evaluate"]["harness"] = {"limit": 10**8}
    project.write_params(params)
    refused(run(project, "-m", "marin.cli", "params", "check"), 2, "evaluate.harness.limit: 100000000 is out of range",
            "<= 100000")


def test_trials_counts_before_it_builds() -> None:
    space = tuple({"param": k, "values": list(range(1000))} for k in KEYS)
    spec = SweepParams(method="grid", space=space, select=SelectRule("bits_per_byte", "min"))
    t0 = time.monotonic()
    with pytest.raises(SweepError, match=r"sweep: 1000000000000 trials \(1000 x 1000 x 1000 x 1000 grid\)"):
        trials(spec, 0)
    assert time.monotonic() - t0 < 0.5
    assert len(trials(SweepParams(method="grid", space=space[:1], select=spec.select, max_trials=1000), 0)) == 1000
