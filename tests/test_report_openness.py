"""What the report's FMTI and MOF rows claim, each against something measured or computed apart from
the code under test: a run's process CPU time against ``os.times`` read here around the work, the FMTI
energy rows against the estimate recomputed by hand from the hours and assumptions, and the MOF class
with the components that keep the release from the next one against the MOF's own licence list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from marin.ledger import Recipe, Run, read_run
from marin.report import fmti, mof
from marin.report.cards import Ctx
from tests.conftest import reference

ENERGY = {"cpu_watts_per_core": 10.0, "gpu_watts": 300.0, "pue": 1.5, "kg_co2e_per_kwh": 0.5}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_run_finished_records_the_process_cpu_time_children_waited_for_included(tmp_path: Path) -> None:
    before = _cpu()
    with Run.start(tmp_path, Recipe("busy", {})) as run:
        _spin(0.3)
        subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                        "while time.process_time() < end: pass"], check=True)  # a child this process waits for
    after = _cpu()
    cpu_s = read_run(run.file.path).end.body_as("run.finished").get("cpu_s", -1.0)
    # since process start (the test session's own CPU before the run included), the spin and the child in it
    assert before + 0.6 <= cpu_s + 0.01 and cpu_s <= after + 0.01, (before, cpu_s, after)


def _fact(value: Any, run_id: str = "train-1", seq: int = 5) -> dict[str, Any]:
    return {"value": value, "text": f"{value:,}" if isinstance(value, int) else str(value),
            "source": {"run_id": run_id, "seq": seq}}


def _ctx(train_cpu_s: float | None, energy: dict[str, float] | None = ENERGY) -> Ctx:
    """A report's facts and doc as gather() shapes them: the train run, and 3 runs behind the model."""
    facts = {"WALL": _fact(120.0), "FLOPS": _fact(6_000_000), "N": _fact(1000), "TOK": _fact(1000),
             "TRAIN_H": {**_fact(0.0667), "source": {"formula": "Σ wall_s × cores / 3600", "inputs": ["WALL"]}},
             "ALL_H": {**_fact(0.2), "source": {"formula": "Σ wall_s × cores / 3600", "inputs": ["WALL"]}},
             "TRAIN_CPU": _fact(95.5), "ALL_CPU": _fact(150.25)}
    doc = {"training": {"wall_s": "WALL", "flops": "FLOPS", "tokens_seen": "TOK"}, "model": {"n_params": "N"},
           "compute": {"runs": 3, "cpu_hours": "ALL_H", "gpu_hours": None, "cpu_s": "ALL_CPU", "cpu_s_runs": 3,
                       "train": {"run_id": "train-1", "cpu_hours": "TRAIN_H", "gpu_hours": None,
                                 "cpu_s": "TRAIN_CPU" if train_cpu_s else None}}}
    return Ctx(facts, doc, {"energy": energy})


def test_fmti_energy_for_the_final_training_run_is_the_train_runs_estimate_and_says_nothing_was_metered() -> None:
    kwh = lambda hours: hours * 10.0 * 1.5 / 1000  # noqa: E731  # CPU-hours × W per core × PUE
    text, evidence = fmti._energy(_ctx(95.5), 0, final=True) or ("", [])
    assert text.startswith("not measured: no power meter or energy counter is read. Estimate: ")
    assert f"{kwh(0.0667):.3g} kWh for the final training run train-1" in text
    assert "process CPU time 95.5 s (measured by `os.times()`" in text and "wall time 120.0 s" in text
    assert text.endswith(f"all 3 runs behind the model, estimated the same way: {kwh(0.2):.3g} kWh")
    assert {"TRAIN_H", "TRAIN_CPU", "WALL", "ALL_H"} <= set(evidence)
    carbon, _ = fmti._energy(_ctx(95.5), 1, final=True) or ("", [])
    assert f"{kwh(0.0667) * 0.5 * 1000:.3g} g CO2-equivalent for the final training run" in carbon
    # the 2024 indicator (energy in building the model): every run behind it, with their measured CPU time
    text, _ = fmti._energy(_ctx(95.5), 0, final=False) or ("", [])
    assert f"{kwh(0.2):.3g} kWh for the 3 runs behind the model" in text
    assert "process CPU time 150.25 s over the 3 runs that record it" in text
    # a train run recorded before cpu_s: said so, not guessed; no assumptions: no estimate at all
    text, _ = fmti._energy(_ctx(None), 0, final=True) or ("", [])
    assert "process CPU time not measured (the run predates run.finished cpu_s)" in text
    assert fmti._energy(_ctx(95.5, None), 0, final=True) is None


def test_fmti_compute_and_duration_rows_say_which_figure_is_an_estimate_and_which_was_measured() -> None:
    c = _ctx(95.5)
    compute, ids = fmti._compute(c)
    assert compute.startswith("final training run train-1: 6,000,000 FLOPs, an estimate, not counted")
    assert "measured: wall time 120.0 s" in compute and "process CPU time 95.5 s" in compute
    assert ids[:1] == ["FLOPS"] and "TRAIN_CPU" in ids
    duration, _ = fmti._duration(c)
    assert duration.startswith("final training run only") and "as a whole is not recorded" in duration


def _licences() -> dict[str, set[str]]:
    """The MOF's accepted licence ids by content type, read here from its list."""
    out: dict[str, set[str]] = {}
    for lic in json.loads(reference("mof-licenses.json").read_text())["licenses"]:
        types = lic["ContentType"]
        for t in [types] if isinstance(types, str) else types:
            out.setdefault(t, set()).add(lic["licenseId"])
    return out


def _release(licences: dict[str, str]) -> dict[str, Any]:
    comps = [{"name": n, "description": "", "location": "", "license_name": lic, "license_path": ""}
             for n, lic in licences.items()]
    return {"release": {"components": comps}}


def _open_release() -> dict[str, str]:
    """Every component under a licence the MOF's list accepts for its first content type."""
    accepted = _licences()
    pick = {t: sorted(ids)[0] for t, ids in accepted.items()}
    return {name: pick[types[0]] for name, (_, _, types) in mof.MOF_COMPONENTS.items()}


def test_mof_states_the_class_reached_the_components_that_reached_it_and_why_the_next_was_missed() -> None:
    licences = reference("mof-licenses.json")
    every = _open_release()
    top = mof.assessment(_release(every), licences)
    assert top["class"] == "Class I - Open Science" and "next_class" not in top
    no_paper = mof.assessment(_release({k: v for k, v in every.items() if k != "Research paper"}), licences)
    assert no_paper["class"] == "Class II - Open Tooling"
    assert no_paper["next_class"] == {"class": "Class I - Open Science",
                                      "missed_because": ["Research paper: not included"]}
    assert f"Training code ({every['Training code']})" in no_paper["required_components_open"]
    assert not any(x.startswith("Research paper") for x in no_paper["required_components_open"])
    # a licence the list does not accept for the component's content type: named, with the type
    assert "Apache-2.0" not in _licences()["data"]
    closed = mof.assessment(_release({**every, "Evaluation data": "Apache-2.0"}), licences)
    assert closed["class"] == "Class III - Open Model"
    assert closed["next_class"]["missed_because"] == [
        "Evaluation data: licence Apache-2.0 is not one the MOF accepts for data"]
    bare = mof.assessment(_release({k: v for k, v in every.items() if k != "Model card"}), licences)
    assert bare == {"class": "Unclassified", "required_components_open": [],
                    "next_class": {"class": "Class III - Open Model", "missed_because": ["Model card: not included"]}}
    assert mof.mof_class(_release(every), licences) == top["class"]
