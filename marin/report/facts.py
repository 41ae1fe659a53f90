"""Every fact a report states, each with the ledger record it came from.

A fact is a value plus its source: a run id, the record's seq and digest, and a JSON
pointer into the record, or into a recorded output file (a manifest) whose digest the
record holds. Derived numbers (tokens seen, FLOPs) name their formula (one of ``FORMULAS``)
and the facts they are computed from. Renderers only print facts; ``marin report verify``
reads each one again at exactly its source (``marin.report.check``).

This module holds what every section shares: :class:`Facts` (how a fact is cited or derived) and
:class:`Context` (what a section's ``facts`` read). Each section's facts are in its own module
(``model``, ``data``, ``training``, ...), gathered in order by :mod:`marin.report.gather`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from marin import hashing, readers
from marin.errors import MarinError
from marin.evaluate import baselines
from marin.ledger.query import Ledger
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.vouching import Vouching


class ReportError(MarinError):
    """A report cannot be built or does not match the ledger."""


def resolve(doc: Any, pointer: str) -> Any:
    """RFC 6901 JSON pointer."""
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        seq: Any = doc
        doc = seq[int(part) if isinstance(doc, list) else part]
    return doc


def esc(key: str) -> str:
    """A key as one JSON pointer token (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


# The formulas a derived fact may name, and how each is computed from its input values.
FORMULAS: dict[str, Callable[[list[Any]], Any]] = {
    "steps × batch_size × seq_len": math.prod,
    "6 × parameters × tokens seen": lambda xs: 6 * math.prod(xs),
    # inputs in pairs (wall time in s, cores or devices) of each run: the hours of compute they took
    "Σ wall_s × cores / 3600": lambda xs: _hours(xs),
    "Σ cpu_s": lambda xs: round(sum(xs), 3),  # the runs' measured process CPU seconds (marin/report/compute.py)
    "tokens seen / training tokens": lambda xs: xs[0] / xs[1],  # epochs (marin/report/budget.py)
    "tokens seen / parameters": lambda xs: xs[0] / xs[1],
    baselines.MARK: baselines.mark_of, baselines.MARK_HIGHER: baselines.mark_higher,  # benchmarks' marks
    # the share of traced output tokens inside verbatim spans (marin/report/memorisation.py): covered, then totals
    "Σ tokens inside spans / Σ output tokens": lambda xs: _share(xs),
}


def _share(xs: list[Any]) -> float:
    half = len(xs) // 2
    total = sum(xs[half:])
    return sum(xs[:half]) / total if total else 0.0


def _hours(xs: list[Any]) -> float:
    """Σ wall × n / 3600 over pairs (wall seconds, n): n a count, or a list of core ids (its length)."""
    pairs = zip(xs[::2], xs[1::2], strict=True)
    return sum(w * (len(cast(list[Any], n)) if isinstance(n, list) else n) for w, n in pairs) / 3600

MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~])")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown's special characters (a fact's text inside a link or a table)."""
    return MD_SPECIAL.sub(r"\\\1", text)


def fmt(value: object) -> str:
    """How a value is printed: integers with separators, floats to 4 decimals (6 significant
    digits below 0.01), text on one line (line breaks as ⏎), everything else as is."""
    if isinstance(value, str):
        return value.replace("\n", " ⏎ ")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value and abs(value) < 0.01:
        return f"{value:.6g}"
    return f"{value:,.4f}"


@dataclass
class Fact:
    id: str
    label: str
    value: Any
    source: dict[str, Any]

    @property
    def text(self) -> str:
        return fmt(self.value)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "value": self.value, "text": self.text, "source": self.source}


@dataclass
class Facts:
    """The facts of one report, in the order they were cited (ids F1, F2, ...)."""

    root: Path
    items: dict[str, Fact] = field(default_factory=dict)

    def _add(self, label: str, value: Any, source: dict[str, Any]) -> Fact:
        f = Fact(f"F{len(self.items) + 1}", label, value, source)
        self.items[f.id] = f
        return f

    def cite(self, label: str, log: RunLog, rec: Record, pointer: str) -> Fact:
        """A value inside a ledger record (``pointer`` into the whole record, e.g. ``/body/step``)."""
        value = resolve(rec.to_dict(), pointer)
        return self._add(label, value, {"run_id": log.run_id, "seq": rec.seq, "record": rec.digest,
                                        "pointer": pointer})

    def cite_file(self, label: str, log: RunLog, rec: Record, doc: dict[str, Any], pointer: str) -> Fact:
        """A value inside a recorded output file (``rec`` is its output record)."""
        out = rec.body_as("output")
        return self._add(label, resolve(doc, pointer), {
            "run_id": log.run_id, "seq": rec.seq, "record": rec.digest, "file": out["path"],
            "file_digest": out["digest"], "pointer": pointer})

    def cite_vsa(self, label: str, path: str, digest: str, statement: dict[str, Any], pointer: str) -> Fact:
        """A value inside the statement of a signed verification summary (verifications/...)."""
        return self._add(label, resolve(statement, pointer), {"vsa": path, "file_digest": digest, "pointer": pointer})

    def derive(self, label: str, formula: str, inputs: list[Fact]) -> Fact:
        """A value computed by one of ``FORMULAS`` from other facts."""
        value = FORMULAS[formula]([f.value for f in inputs])
        return self._add(label, value, {"formula": formula, "inputs": [f.id for f in inputs]})

    def to_dict(self) -> dict[str, Any]:
        return {k: f.to_dict() for k, f in self.items.items()}


@dataclass
class Context:
    """What a section's ``facts`` read: the project, its ledger, the runs the report cites by stage
    (the model's lineage and the runs that read the model), the lineage table, the sections gathered
    before it, and what the Independent verification section is judged against (None: left out)."""

    root: Path
    ledger: Ledger
    logs: dict[str, RunLog]
    doc: dict[str, Any]
    vouching: Vouching | None = None

    def lineage(self) -> list[RunLog]:
        """The runs behind the report (``doc["lineage"]``), oldest first."""
        return [self.ledger.runs[r["run_id"]] for r in self.doc["lineage"]]


def read_output_file(root: Path, rec: Record) -> dict[str, Any]:
    """A recorded JSON output (a manifest), checked against its recorded digest."""
    out = rec.body_as("output")
    path = root / out["path"]
    if not path.is_file():
        raise ReportError(f"{out['path']}: recorded by {rec.run_id} seq {rec.seq} but missing; "
                          "run `dvc checkout` or `dvc repro`")
    got = hashing.file_digest(path)
    if got != out["digest"]:
        raise ReportError(f"{out['path']}: hashes to {got}, but {rec.run_id} seq {rec.seq} recorded "
                          f"{out['digest']}; the report is built only from recorded outputs")
    return readers.read_json(path, "manifest", ReportError)


def output(log: RunLog, name: str) -> Record:
    """The output record ``name`` of a run."""
    for r in log.of_kind("output"):
        if r.body_as("output")["name"] == name:
            return r
    raise ReportError(f"run {log.run_id} recorded no output {name!r}")


