"""``marin diff RUN_A RUN_B``: two ledger runs side by side, and their first divergence.

Params, code, determinism class, inputs, outputs and metrics are compared field by
field; for train runs the first divergence is the earliest step whose exact metric values or
checkpoint tensor digest differ (then the first differing output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin.config import flatten
from marin.errors import MarinError
from marin.ledger.store import RunLog, load_run, resolve_run_id


@dataclass
class Diff:
    a: str
    b: str
    sections: dict[str, list[tuple[str, Any, Any]]] = field(default_factory=dict)
    first_divergence: str | None = None

    @property
    def identical(self) -> bool:
        return not any(self.sections.values())


def _compare(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _load(root: Path, run_id: str) -> RunLog:
    log = load_run(root, resolve_run_id(root, run_id))  # a short id too: a unique prefix, the 8-hex tail
    if log.started is None:
        raise MarinError(f"{log.path}: has no run.started record")
    return log


def diff(root: Path, run_a: str, run_b: str) -> Diff:
    """Two runs of the ledger under ``root`` compared section by section, and their first divergence."""
    a, b = _load(root, run_a), _load(root, run_b)
    sa, sb = a.start.body, b.start.body
    d = Diff(a.run_id, b.run_id)
    d.sections["params"] = _compare(flatten(sa["params"]), flatten(sb["params"]))
    code_keys = ("git_commit", "dirty", "diff_digest", "code_digest", "closure_digest", "lock_digest")
    d.sections["code"] = _compare({k: sa["code"].get(k) for k in code_keys}, {k: sb["code"].get(k) for k in code_keys})
    ca, cb = ({f"closure {p}": v for p, v in (s["code"].get("closure") or {}).items()} for s in (sa, sb))
    d.sections["code"] += _compare(ca, cb)  # the files of the stage's code that differ
    d.sections["determinism class"] = _compare(flatten(sa["determinism_class"]),
                                               flatten(sb["determinism_class"]))
    d.sections["inputs"] = _compare({i["name"]: i["digest"] for i in sa["inputs"]},
                                    {i["name"]: i["digest"] for i in sb["inputs"]})
    d.sections["outputs"] = _compare({o["name"]: o["digest"] for o in a.bodies("output")},
                                     {o["name"]: o["digest"] for o in b.bodies("output")})
    ma = {(m["step"], k): v["hex"] for m in a.bodies("metric") for k, v in m["values"].items()}
    mb = {(m["step"], k): v["hex"] for m in b.bodies("metric") for k, v in m["values"].items()}
    differing = [key for key in sorted(set(ma) | set(mb)) if ma.get(key) != mb.get(key)]
    d.sections["metrics"] = [(f"step {s} {k}", _exact(ma.get((s, k))), _exact(mb.get((s, k)))) for s, k in differing]
    ca = {c["step"]: c["digest"] for c in a.bodies("checkpoint")}
    cb = {c["step"]: c["digest"] for c in b.bodies("checkpoint")}
    d.first_divergence = first_divergence(differing, ca, cb)
    if d.first_divergence is None and d.sections["outputs"]:
        d.first_divergence = f"output {d.sections['outputs'][0][0]}"
    return d


def _exact(hex_value: str | None) -> float | str:
    return "<absent>" if hex_value is None else float.fromhex(hex_value)


def first_divergence(metrics: list[tuple[int, str]], ca: dict[int, str], cb: dict[int, str]) -> str | None:
    """The earliest step at which the runs differ: its differing metrics (``metrics``: the (step,
    name) pairs whose exact values differ), else the checkpoint whose tensor digest differs. At the
    same step the metrics are named: they are measured during the step, the checkpoint after it."""
    ckpt = next((s for s in sorted(set(ca) & set(cb)) if ca[s] != cb[s]), None)
    step = min((s for s, _ in metrics), default=None)
    if ckpt is not None and (step is None or ckpt < step):
        return f"checkpoint at step {ckpt}: {ca[ckpt]} vs {cb[ckpt]}"
    if step is None:
        return None
    return f"metrics at step {step}: {', '.join(k for s, k in metrics if s == step)}"


def render(d: Diff) -> str:
    """The diff as text: each section's count of differences and the first 20 of them."""
    lines = [f"diff {d.a} {d.b}"]
    for name, rows in d.sections.items():
        lines.append(f"{name}: {'same' if not rows else f'{len(rows)} difference(s)'}")
        for key, x, y in rows[:20]:
            lines.append(f"  {key}: {x!r} -> {y!r}")
        if len(rows) > 20:
            lines.append(f"  ... and {len(rows) - 20} more")
    lines.append(f"first divergence: {d.first_divergence or 'none'}")
    return "\n".join(lines)
