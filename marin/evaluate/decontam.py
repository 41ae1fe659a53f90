"""What the evaluate stage does with stage decontaminate's findings (data/decontamination.json),
by ``evaluate.decontaminate``:

- ``report``: every item is scored, as without it; each task's record also holds how many of its
  scored items are contaminated and, per metric, ``clean/<metric>``: the task's own aggregation
  (lm-eval's ``Task.aggregation``) over the per-item values of the clean items only.
- ``exclude``: only the clean items among those ``limit`` would score are scored (lm-eval's
  ``samples``), so the recorded score is the harness's on the clean items; ``excluded`` counts the rest.

A task the file does not cover (added since, or with another number of items) is not checked:
under ``exclude`` it fails in one line naming ``dvc repro decontaminate``; under ``report`` its record
says ``decontamination: not checked``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import readers, stages
from marin.errors import StageError
from marin.ledger import exact

OUT = stages.declaration("decontaminate").out("decontamination")  # marin/stages/table.py
NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class Findings:
    mode: str  # report | exclude
    ngram: int
    tasks: dict[str, dict[str, Any]]  # task -> {items, contaminated, fraction, ids} or {error}

    def problem(self, name: str, task: Any) -> str | None:
        """Why ``task`` has no findings that fit it (one line), or None."""
        found = self.tasks.get(name)
        if found is None or "error" in found:
            why = "is not in" if found is None else "could not be checked by"
        elif found["items"] != len(task.eval_docs):
            why = f"has {len(task.eval_docs)} items, not the {found['items']} checked by"
        else:
            return None
        return f"harness task {name!r} {why} stage decontaminate ({OUT}); run `dvc repro decontaminate`"

    def dirty(self, name: str) -> set[int]:
        return set(self.tasks[name]["ids"])

    def clean_ids(self, name: str, limit: int | None) -> list[int]:
        """The clean items among the first ``limit`` (all without one), in order."""
        n = self.tasks[name]["items"]
        dirty = self.dirty(name)
        return [i for i in range(min(n, limit) if limit is not None else n) if i not in dirty]

    def values(self, name: str, task: Any, res: dict[str, Any], limit: int | None) -> dict[str, Any]:
        """The decontamination values of one task's eval record (``res``: simple_evaluate's result)."""
        out: dict[str, Any] = {"decontamination": self.mode, "decontamination_ngram": self.ngram}
        if self.problem(name, task) is not None:
            return {**out, "decontamination": NOT_CHECKED}
        dirty = self.dirty(name)
        if self.mode == "exclude":
            scanned = min(self.tasks[name]["items"], limit) if limit is not None else self.tasks[name]["items"]
            return {**out, "excluded": scanned - len(self.clean_ids(name, limit))}
        samples = res["samples"][name]
        scored = {s["doc_id"] for s in samples}
        out["contaminated"] = len(scored & dirty)
        out["clean/samples"] = len(scored - dirty)
        aggregate = task.aggregation()
        for key in res["results"][name]:
            metric, _, filt = key.partition(",")
            if not filt or metric not in aggregate or metric.endswith("_stderr"):
                continue
            items = [s[metric] for s in samples if s["filter"] == filt and s["doc_id"] not in dirty]
            if items:
                label = metric if filt == "none" else f"{metric}/{filt}"
                out[f"clean/{label}"] = exact(float(aggregate[metric](items)))
        return out


def load(root: Path, mode: str) -> Findings | None:
    """The findings of data/decontamination.json, or None without it under ``report``; ``exclude``
    without it is a StageError."""
    path = Path(root) / OUT
    if not path.is_file():
        if mode == "exclude":
            raise StageError(f"evaluate.decontaminate: exclude needs {OUT}, which is missing; run "
                             "`dvc repro decontaminate` (or set evaluate.decontaminate: report)")
        return None
    data = readers.read_json(path, "manifest", StageError)
    return Findings(mode, data["ngram"], data["tasks"])
