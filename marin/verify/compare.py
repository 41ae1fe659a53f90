"""Compare a recorded run with its replay, record by record, in the recorded order.

Comparable records are keyed so that the replay's counterpart can be found: inputs and
outputs by name, metrics and checkpoints by step, evals by (name, split, corpus). Exact
floats compare by their ``float.hex()``; timings and times never compare.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from marin.config import flatten
from marin.ledger.records import Record
from marin.ledger.store import RunLog


@dataclass
class Divergence:
    """The first place a replay differs from the record (or a class difference)."""

    seq: int
    kind: str
    what: str
    step: int | None = None
    name: str | None = None
    tensor: str | None = None
    recorded: Any = None
    replayed: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        where = f"seq {self.seq} {self.kind}"
        where += f" step {self.step}" if self.step is not None else ""
        where += f" {self.name}" if self.name is not None else ""
        where += f" tensor {self.tensor}" if self.tensor is not None else ""
        return f"{where}: {self.what}"


def _exact(values: dict[str, Any]) -> dict[str, Any]:
    """The comparable part of a values mapping: hex for exact floats, the value otherwise."""
    return {k: v["hex"] if isinstance(v, dict) and "hex" in v else v for k, v in values.items()}


def key_and_value(r: Record) -> tuple[tuple[Any, ...], Any] | None:
    """The comparison key and value of a record, or None for records that never compare."""
    b = r.body
    if r.kind in ("input", "output"):
        return (r.kind, b["name"]), b["digest"]
    if r.kind == "checkpoint":
        return ("checkpoint", b["step"]), b["digest"]
    if r.kind == "metric":
        return ("metric", b["step"]), _exact(b["values"])
    if r.kind == "eval":
        return ("eval", b["name"], b["split"], b.get("corpus")), {
            "values": _exact(b["values"]), "samples": [s["token_ids"] for s in b.get("samples", [])]}
    return None


def comparable(log: RunLog) -> dict[tuple[Any, ...], tuple[Record, Any]]:
    out = {}
    for r in log.records:
        kv = key_and_value(r)
        if kv is not None:
            out[kv[0]] = (r, kv[1])
    return out


def _describe(key: tuple[Any, ...], rec: Record, recorded: Any, replayed: Any) -> Divergence:
    kind = key[0]
    step = rec.body.get("step") if kind in ("metric", "checkpoint") else None
    name = rec.body.get("name") if kind in ("input", "output", "eval") else None
    if kind == "metric" and isinstance(replayed, dict):
        bad = [k for k in recorded if recorded.get(k) != replayed.get(k)]
        what = ", ".join(f"{k} recorded {_f(recorded[k])} replayed {_f(replayed.get(k))}" for k in bad)
        return Divergence(rec.seq, kind, what, step=step, name=bad[0] if bad else None,
                          recorded={k: recorded[k] for k in bad}, replayed={k: replayed.get(k) for k in bad})
    if replayed is None:
        return Divergence(rec.seq, kind, "recorded, but the replay did not produce it", step=step, name=name,
                          recorded=recorded)
    return Divergence(rec.seq, kind, f"recorded {_short(recorded)}, replayed {_short(replayed)}", step=step,
                      name=name, recorded=recorded, replayed=replayed)


def compare(recorded: RunLog, replay: RunLog) -> tuple[dict[str, int], list[Divergence]]:
    """Counts of compared records by kind, and every divergence in recorded order."""
    mine, theirs = comparable(recorded), comparable(replay)
    counts: dict[str, int] = {}
    out = []
    for key, (rec, value) in sorted(mine.items(), key=lambda kv: kv[1][0].seq):
        counts[key[0]] = counts.get(key[0], 0) + 1
        other = theirs.get(key)
        if other is None or other[1] != value:
            out.append(_describe(key, rec, value, None if other is None else other[1]))
    for key, (rec, value) in theirs.items():
        if key not in mine:
            out.append(Divergence(recorded.finished.seq if recorded.finished else -1, key[0],
                                  f"the replay produced {key} = {_short(value)}, which the run does not record "
                                  "(a record was removed)", step=rec.body.get("step"), replayed=value))
    return counts, out


def class_differences(recorded: dict[str, Any], replayed: dict[str, Any]) -> list[dict[str, Any]]:
    a, b = flatten(recorded), flatten(replayed)
    return [{"key": k, "recorded": a.get(k), "verifier": b.get(k)} for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def _dist(x: float, y: float) -> dict[str, float]:
    d = abs(x - y)
    return {"abs": d, "rel": d / max(abs(x), 1e-300)}


def metric_distances(recorded: RunLog, replay: RunLog) -> dict[str, Any]:
    """Per metric and eval value: the largest absolute and relative difference over all records."""
    mine, theirs = comparable(recorded), comparable(replay)
    out: dict[str, dict[str, Any]] = {}
    for key, (rec, value) in mine.items():
        other = theirs.get(key)
        if key[0] not in ("metric", "eval") or other is None:
            continue
        vals = value if key[0] == "metric" else value["values"]
        ovals = other[1] if key[0] == "metric" else other[1]["values"]
        for k, hx in vals.items():
            if not isinstance(hx, str) or not isinstance(ovals.get(k), str):
                continue
            name = k if key[0] == "metric" else "/".join(str(p) for p in (*key[1:], k) if p is not None)
            x, y = float.fromhex(hx), float.fromhex(ovals[k])
            d = _dist(x, y)
            cur = out.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "compared": 0})
            cur["compared"] += 1
            if d["abs"] > cur["max_abs"]:
                cur.update(max_abs=d["abs"], at=rec.body.get("step", key[1]) if key[0] == "metric" else None)
            cur["max_rel"] = max(cur["max_rel"], d["rel"])
    return {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in sorted(out.items())}


def _f(hx: Any) -> str:
    return f"{float.fromhex(hx)!r} ({hx})" if isinstance(hx, str) else repr(hx)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 120 else s[:117] + "..."
