"""The report's Compute section: tokens seen, FLOPs, wall time, the CPU- and GPU-hours of every run
behind the report (derived facts from each run's ``run.finished`` wall time and ``run.started`` cores
or devices), the training budget (:mod:`marin.report.budget`) and, with ``report.energy`` assumptions,
an energy and CO2 estimate (:mod:`marin.report.energy`)."""

from __future__ import annotations

from typing import Any

from marin.export import energy
from marin.report import budget
from marin.report.facts import Context, Fact, Facts
from marin.report.page import Page, table

GPU_BACKENDS = ("gpu", "cuda", "rocm")


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """CPU-hours (wall time × usable cores) of every run behind the report, and GPU-hours
    (wall time × devices) of the runs whose backend was a GPU."""
    cpu: list[Fact] = []
    gpu: list[Fact] = []
    logs = c.lineage()
    for log in logs:
        started = log.start_body
        wall = f.cite(f"{started['stage']} wall time (s)", log, log.end, "/body/wall_s")
        cpu += [wall, f.cite(f"{started['stage']} usable cores", log, log.start, "/body/env/usable_cores")]
        if started["determinism_class"].get("backend") in GPU_BACKENDS:
            gpu += [wall, f.cite(f"{started['stage']} devices", log, log.start,
                                 "/body/determinism_class/device_count")]
    return {"runs": len(logs),
            "cpu_hours": f.derive("CPU-hours (wall time × usable cores)", "Σ wall_s × cores / 3600", cpu).id,
            "gpu_hours": f.derive("GPU-hours (wall time × devices)", "Σ wall_s × cores / 3600", gpu).id
            if gpu else None}


def lines(p: Page) -> list[str]:
    doc, v = p.doc, p.v
    tr, env, det, cp = doc["training"], doc["environment"]["env"], doc["environment"]["determinism_class"], \
        doc["compute"]
    gpu = v(cp["gpu_hours"]) if cp["gpu_hours"] else "0 (no run used a GPU)"
    out = ["## Compute", ""]
    out += table(["quantity", "value"], [
        ["tokens seen (steps × batch × sequence length)", v(tr["tokens_seen"])],
        ["training FLOPs (6·N·D estimate)", v(tr["flops"])], ["train wall time (s)", v(tr["wall_s"])],
        [f"CPU-hours, the {cp['runs']} runs behind this report (wall time × usable cores)", v(cp["cpu_hours"])],
        ["GPU-hours (wall time × devices)", gpu],
        ["hardware", f"{v(env['cpu_model'])}, {v(env['cpu_count'])} cores ({v(env['machine'])})"],
        ["cores usable by the train run", v(env["cores_used"])],
        ["XLA CPU threads, devices", f"{v(det.get('xla_cpu_threads'))}, {v(det.get('device_count'))}"]])
    return [*out, budget.compute_line(v, doc), "", budget.WALL_TIME_SCOPE, "", *_energy(p)]


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
            "readings of this machine; the hours are from the ledger's wall times.", ""]
