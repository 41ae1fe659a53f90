"""Compare a recorded run with its replay, record by record, in the recorded order.

Comparable records are keyed so that the replay's counterpart can be found: inputs and
outputs by name, metrics and checkpoints by step, evals by (name, split, corpus). Exact
floats compare by their ``float.hex()``; timings and times never compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

from marin.config import flatten
from marin.ledger.bodies import ClassDifference, CpuDifference, Exact
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
    index: int | None = None  # the flat index in ``tensor`` (a checkpoint's first differing value, a log entry)
    recorded: Any = None
    replayed: Any = None
    independent: bool | None = None  # True: not explained by a determinism class difference

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        where = f"seq {self.seq} {self.kind}"
        where += f" step {self.step}" if self.step is not None else ""
        where += f" {self.name}" if self.name is not None else ""
        where += f" tensor {self.tensor}" if self.tensor is not None else ""
        where += f" index {self.index}" if self.index is not None else ""
        return f"{where}: {self.what}"


# Fields that legitimately differ between a run and its replay: wall-clock timings, the checkpoint
# directory (it is named after the run id) and its files' digest (orbax's metadata holds timestamps).
# Everything else in a body must repeat.
UNCOMPARED = {"metric": ("timing",), "checkpoint": ("path", "files_digest", "stored")}  # stored: where, not what


def key_of(r: Record) -> tuple[Any, ...] | None:
    """The comparison key of a record (its counterpart in the replay has the same key), or None
    for records that never compare (run.started, run.resumed, run.finished, verification)."""
    b = r.body
    if r.kind in ("input", "output"):
        return (r.kind, b["name"])
    if r.kind in ("checkpoint", "metric"):
        return (r.kind, b["step"])
    if r.kind == "eval":
        return ("eval", b["name"], b["split"], b.get("corpus"))
    return None


def value_of(r: Record) -> dict[str, Any]:
    """The whole body but the uncompared fields: every value a report may cite is compared."""
    return {k: v for k, v in r.body.items() if k not in UNCOMPARED.get(r.kind, ())}


def comparable(log: RunLog) -> tuple[dict[tuple[Any, ...], Record], list[Divergence]]:
    """Records by key, and a divergence for each second record under one key (a duplicate
    would otherwise go uncompared)."""
    out: dict[tuple[Any, ...], Record] = {}
    dups: list[Divergence] = []
    for r in log.records:
        key = key_of(r)
        if key is None:
            continue
        if key in out:
            dups.append(Divergence(r.seq, r.kind, f"a second {r.kind} record for {key[1:]} (first at seq "
                                   f"{out[key].seq})", step=r.step, name=r.name,
                                   independent=True))
            continue
        out[key] = r
    return out, dups


def inexact(r: Record) -> list[Divergence]:
    """Exact floats whose decimal and ``float.hex()`` disagree (one of them was edited)."""
    out: list[Divergence] = []

    def walk(x: Any, path: str) -> None:
        if isinstance(x, dict):
            x = cast(dict[str, Any], x)
            if set(x) == {"value", "hex"} and isinstance(x["value"], int | float):
                if float(x["value"]).hex() != x["hex"] and x["hex"] not in ("nan", "inf", "-inf"):
                    out.append(Divergence(r.seq, r.kind, f"{path}: decimal {x['value']!r} is not hex {x['hex']}",
                                          step=r.step, name=path.rsplit("/", 1)[-1], independent=True))
                return
            for k, v in x.items():
                walk(v, f"{path}/{k}")
        elif isinstance(x, list):
            for i, v in enumerate(cast(list[Any], x)):
                walk(v, f"{path}/{i}")

    walk(r.body, "")
    return out


def _describe(rec: Record, replayed: Record | None) -> Divergence:
    kind, step = rec.kind, rec.step
    name = rec.name if kind in ("input", "output", "eval") else None
    if replayed is None:
        return Divergence(rec.seq, kind, "recorded, but the replay did not produce it", step=step, name=name,
                          independent=True)
    a, b = value_of(rec), value_of(replayed)
    if kind in ("metric", "eval") and a.get("values") != b.get("values"):
        d = values_divergence(rec, b.get("values", {}))
        d.name = d.name if kind == "metric" else name
        return d
    bad = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    what = "; ".join(f"{k} recorded {_short(a.get(k))}, replayed {_short(b.get(k))}" for k in bad)
    return Divergence(rec.seq, kind, what, step=step, name=name, recorded={k: a.get(k) for k in bad},
                      replayed={k: b.get(k) for k in bad})


def values_of(rec: Record) -> Mapping[str, Exact | int | str]:
    """The values of a metric or an eval record (a LedgerError for any other kind)."""
    return rec.body_as("metric")["values"] if rec.kind == "metric" else rec.body_as("eval")["values"]


def values_divergence(rec: Record, replayed: dict[str, Any]) -> Divergence:
    """A metric or eval record whose values differ from ``replayed``: which values, both ways."""
    va = values_of(rec)
    bad = [k for k in sorted(set(va) | set(replayed)) if va.get(k) != replayed.get(k)]
    what = ", ".join(f"{k} recorded {_f(va.get(k))} replayed {_f(replayed.get(k))}" for k in bad)
    return Divergence(rec.seq, rec.kind, what, step=rec.step, name=bad[0] if bad else None,
                      recorded={k: va.get(k) for k in bad}, replayed={k: replayed.get(k) for k in bad})


def compare(recorded: RunLog, replay: RunLog) -> tuple[dict[str, int], list[Divergence]]:
    """Counts of compared records by kind, and every divergence in recorded order."""
    mine, out = comparable(recorded)
    theirs, _ = comparable(replay)
    counts: dict[str, int] = {}
    for key, rec in sorted(mine.items(), key=lambda kv: kv[1].seq):
        counts[key[0]] = counts.get(key[0], 0) + 1
        out.extend(inexact(rec))
        other = theirs.get(key)
        if other is None or value_of(other) != value_of(rec):
            out.append(_describe(rec, other))
    end = recorded.finished.seq if recorded.finished else -1
    for key, rec in theirs.items():
        if key not in mine:
            out.append(Divergence(end, key[0], f"the replay produced {key[0]} {key[1:]}, which the run does not "
                                  "record (a record was removed)", step=rec.step,
                                  replayed=value_of(rec), independent=True))
    return counts, sorted(out, key=lambda d: d.seq)


def class_differences(recorded: Mapping[str, Any], replayed: Mapping[str, Any]) -> list[ClassDifference]:
    a, b = flatten(recorded), flatten(replayed)
    return [ClassDifference(key=k, recorded=a.get(k), verifier=b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def cpu_differences(recorded: Mapping[str, Any], verifier: Mapping[str, Any]) -> CpuDifference | None:
    """How the verifier's CPU differs from the recorder's (model, level, kernel-deciding features,
    from the two environment fingerprints), or None when it is the same CPU as far as they say."""
    keys = ("cpu_model", "isa_level")
    mine, theirs = set(recorded.get("isa_flags") or []), set(verifier.get("isa_flags") or [])
    if all(recorded.get(k) == verifier.get(k) for k in keys) and mine == theirs:
        return None
    return CpuDifference(recorded={k: recorded.get(k) for k in keys}, verifier={k: verifier.get(k) for k in keys},
                         only_recorded=sorted(mine - theirs), only_verifier=sorted(theirs - mine))


def describe_cpu(d: CpuDifference) -> str:
    """``cpu_differences`` in a few words: the two models, then the features one has and not the other."""
    a, b = d["recorded"], d["verifier"]
    parts = [f"recorded on {a.get('cpu_model')} ({a.get('isa_level')}), verified on {b.get('cpu_model')} "
             f"({b.get('isa_level')})"]
    if d["only_recorded"]:
        parts.append(f"features only the recorder has: {', '.join(d['only_recorded'])}")
    if d["only_verifier"]:
        parts.append(f"only the verifier has: {', '.join(d['only_verifier'])}")
    return "; ".join(parts)


def _dist(x: float, y: float) -> dict[str, float]:
    d = abs(x - y)
    return {"abs": d, "rel": d / max(abs(x), 1e-300)}


def metric_distances(recorded: RunLog, replay: RunLog) -> dict[str, Any]:
    """Per metric and eval value: the largest absolute and relative difference over all records."""
    mine, _ = comparable(recorded)
    theirs, _ = comparable(replay)
    out: dict[str, dict[str, Any]] = {}
    for key, rec in mine.items():
        other = theirs.get(key)
        if key[0] not in ("metric", "eval") or other is None:
            continue
        for k, v in values_of(rec).items():
            w = values_of(other).get(k)
            if not (isinstance(v, dict) and isinstance(w, dict)):
                continue
            name = k if key[0] == "metric" else "/".join(str(p) for p in (*key[1:], k) if p is not None)
            d = _dist(float.fromhex(v["hex"]), float.fromhex(w["hex"]))
            cur = out.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "compared": 0})
            cur["compared"] += 1
            if d["abs"] > cur["max_abs"]:
                cur.update(max_abs=d["abs"], at=rec.body_as("metric")["step"] if key[0] == "metric" else None)
            cur["max_rel"] = max(cur["max_rel"], d["rel"])
    return {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in sorted(out.items())}


def _f(v: Any) -> str:
    return f"{v['value']!r} ({v['hex']})" if isinstance(v, dict) and "hex" in v else repr(cast(object, v))


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 120 else s[:117] + "..."
