"""The report's Compute section: tokens seen, FLOPs, wall time, the CPU- and GPU-hours of every run
behind the report (derived facts from each run's ``run.finished`` wall time and ``run.started`` cores
or devices), the training budget (:mod:`marin.report.budget`) and, with ``report.energy`` assumptions,
an energy and CO2 estimate (:mod:`marin.report.energy`)."""

from __future__ import annotations

from typing import Any

from marin.export import energy
from marin.ledger.store import RunLog
from marin.report import budget
from marin.report.facts import Context, Fact, Facts
from marin.report.page import Page, table

GPU_BACKENDS = ("gpu", "cuda", "rocm")


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """CPU-hours (wall time × usable cores) of every run behind the report, GPU-hours (wall time × devices)
    of the runs whose backend was a GPU, the process CPU time the runs measured (``cpu_s``, absent in runs
    written before it was), and the same for the final training run alone (``train``)."""
    cpu: list[Fact] = []
    gpu: list[Fact] = []
    measured: list[Fact] = []
    train: dict[str, list[Fact]] = {"cpu": [], "gpu": [], "cpu_s": []}
    logs, train_id = c.lineage(), c.logs["train"].run_id
    for log in logs:
        run = _run_facts(f, log)
        cpu += run["cpu"]
        gpu += run["gpu"]
        measured += run["cpu_s"]
        if log.run_id == train_id:
            train = run
    return {"runs": len(logs), "cpu_hours": _hours(f, "CPU-hours (wall time × usable cores)", cpu),
            "gpu_hours": _hours(f, "GPU-hours (wall time × devices)", gpu),
            "cpu_s": f.derive("process CPU time of the runs (s)", CPU_S, measured).id if measured else None,
            "cpu_s_runs": len(measured),
            "train": {"run_id": train_id, "cpu_hours": _hours(f, "train CPU-hours (wall time × usable cores)",
                                                              train["cpu"]),
                      "gpu_hours": _hours(f, "train GPU-hours (wall time × devices)", train["gpu"]),
                      "cpu_s": train["cpu_s"][0].id if train["cpu_s"] else None}}


CPU_S = "Σ cpu_s"
HOURS = "Σ wall_s × cores / 3600"
CPU_S_SCOPE = ("measured by `os.times()` at the end of each run: user + system CPU seconds of the stage's process "
               "since it started (imports included) and of the child processes it waited for; the other processes "
               "of a multi-process layout are not in it")


def _hours(f: Facts, label: str, pairs: list[Fact]) -> str | None:
    return f.derive(label, HOURS, pairs).id if pairs else None


def _run_facts(f: Facts, log: RunLog) -> dict[str, list[Fact]]:
    """One run's (wall time, usable cores) pair, its (wall time, devices) pair on a GPU backend, and its
    measured process CPU seconds when its run.finished records them."""
    started = log.start_body
    stage = started["stage"]
    wall = f.cite(f"{stage} wall time (s)", log, log.end, "/body/wall_s")
    out: dict[str, list[Fact]] = {
        "cpu": [wall, f.cite(f"{stage} usable cores", log, log.start, "/body/env/usable_cores")], "gpu": [],
        "cpu_s": []}
    if started["determinism_class"].get("backend") in GPU_BACKENDS:
        out["gpu"] = [wall, f.cite(f"{stage} devices", log, log.start, "/body/determinism_class/device_count")]
    if "cpu_s" in log.end.body_as("run.finished"):
        out["cpu_s"] = [f.cite(f"{stage} process CPU time (s)", log, log.end, "/body/cpu_s")]
    return out


def lines(p: Page) -> list[str]:
    doc, v = p.doc, p.v
    tr, env, det, cp = doc["training"], doc["environment"]["env"], doc["environment"]["determinism_class"], \
        doc["compute"]
    gpu = v(cp["gpu_hours"]) if cp["gpu_hours"] else "0 (no run used a GPU)"
    out = ["## Compute", ""]
    out += table(["quantity", "value"], [
        ["tokens seen (steps × batch × sequence length)", v(tr["tokens_seen"])],
        ["training FLOPs (6·N·D estimate)", v(tr["flops"])], ["train wall time (s)", v(tr["wall_s"])],
        [f"CPU-hours, the {cp['runs']} runs behind this report (wall time × usable cores: the cores each run held, "
         "not the CPU time it used)", v(cp["cpu_hours"])],
        ["GPU-hours (wall time × devices)", gpu], _measured_row(p),
        ["hardware", f"{v(env['cpu_model'])}, {v(env['cpu_count'])} cores ({v(env['machine'])})"],
        ["cores usable by the train run", v(env["cores_used"])],
        ["XLA CPU threads, devices", f"{v(det.get('xla_cpu_threads'))}, {v(det.get('device_count'))}"]])
    return [*out, budget.compute_line(v, doc), "", budget.WALL_TIME_SCOPE, "", *_energy(p)]


def _measured_row(p: Page) -> list[str]:
    """The process CPU time the runs measured, with what it covers, or why it is absent."""
    cp = p.doc["compute"]
    if not cp.get("cpu_s"):
        return ["process CPU time (s), measured", "not measured: these runs were recorded before run.finished held "
                "`cpu_s`; rerun them to measure it"]
    return [f"process CPU time (s), measured, {cp['cpu_s_runs']} of the {cp['runs']} runs ({CPU_S_SCOPE})",
            p.v(cp["cpu_s"])]


def _energy(p: Page) -> list[str]:
    """The energy and CO2 estimate from the hours and params.yaml's assumptions, said to be one."""
    e, cp = p.meta.get("energy"), p.doc["compute"]
    estimate = energy.compute_energy(lambda fid: p.facts[fid].value, cp, e)
    if estimate is None or e is None:
        return ["Energy and CO2: not estimated (no `report.energy` assumptions in params.yaml).", ""]
    return [f"**Estimate** (not a measurement): {energy.kwh_text(estimate[0])} and {energy.co2_text(estimate[1])}, "
            f"as (CPU-hours × {e['cpu_watts_per_core']:g} W per core + GPU-hours × {e['gpu_watts']:g} W per GPU) × "
            f"PUE {e['pue']:g} × {e['kg_co2e_per_kwh']:g} kg CO2e per kWh. The power draws, the data-centre overhead "
            "(PUE) and the grid's carbon intensity are assumptions from `params.yaml: report.energy`, not "
            "readings of this machine, and no power meter or energy counter is read; the hours are from the "
            "ledger's wall times.", ""]
