"""The energy and carbon estimate a report states: kWh and kg CO2-equivalent of the runs behind it, from
their CPU- and GPU-hours and the lab's assumptions (``params.yaml: report.energy``): power per core and per GPU,
the data centre's PUE and the grid's carbon intensity. An estimate, never a reading of the machine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def compute_energy(value: Callable[[str], Any], compute: dict[str, Any],
                   e: dict[str, Any] | None) -> tuple[float, float] | None:
    """(kWh, kg CO2e) of the runs behind the report (``compute``: doc["compute"], its facts read by
    ``value``), or None without ``report.energy`` assumptions: what the report's Compute section and
    the FMTI energy and carbon indicators both state."""
    if not e:
        return None
    return energy(value(compute["cpu_hours"]), value(compute["gpu_hours"]) if compute["gpu_hours"] else 0.0, e)


def kwh_text(kwh: float) -> str:
    return f"{kwh:.3g} kWh"


def co2_text(kg: float) -> str:
    return f"{kg * 1000:.3g} g CO2-equivalent"


def energy(cpu_hours: float, gpu_hours: float, e: dict[str, Any]) -> tuple[float, float]:
    """(kWh, kg CO2e) of the compute under the assumptions ``e`` (params.yaml: report.energy)."""
    kwh = (cpu_hours * e["cpu_watts_per_core"] + gpu_hours * e["gpu_watts"]) * e["pue"] / 1000
    return kwh, kwh * e["kg_co2e_per_kwh"]
