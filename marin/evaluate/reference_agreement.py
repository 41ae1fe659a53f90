"""Where the evaluate stage and a reference of the same weights disagree, item by item (issue 57, item 1).

A reference folder that is this project's own export (:func:`marin.evaluate.reference_stage.own_export`) holds
the weights the evaluate stage scored, run by another framework: lm-eval's ``hf`` model runs them in PyTorch
(transformers' eager CPU kernels), evaluate in JAX (XLA's fused kernels). The same float32 weights summed in
another order give log-likelihoods that differ in their last bits, and an item whose choices lie closer than
that scores differently. Each harness task's per-sample results are compared with those of the latest evaluate
run of the same model (its ``harness_samples`` output, read only while it still has the recorded digest): the
items whose per-sample scores differ, named, and the largest log-likelihood difference over every request,
recorded as an ``agreement:<task>`` eval record that the report shows under its table of references.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import hashing, readers, stages
from marin.errors import StageError

PREFIX = "agreement:"
NAMED = 20  # items named in a record; the count covers them all
FRAMEWORKS = ("lm-eval's `hf` model runs the weights in PyTorch (transformers' eager CPU kernels), the evaluate "
              "stage in JAX (XLA's fused kernels): the same float32 weights summed in another order give "
              "log-likelihoods that differ in their last bits, and an item whose answers lie closer than that "
              "scores differently")


@dataclass(frozen=True)
class Ours:
    """The evaluate run of the same weights and its per-sample file (project-relative), as the ledger has them."""

    run_id: str
    run_file: str
    samples: str


def same_weights(root: Path, export_run: str) -> Ours | None:
    """The latest succeeded evaluate run whose ``model`` input is the model the export run exported, when its
    ``harness_samples`` output is still on disk with the digest it recorded; None otherwise."""
    from marin.ledger.query import Ledger

    with Ledger(root, sources=stages.SOURCE_STAGES, skip=("metric",)) as ledger:
        model = next((i["digest"] for i in ledger.runs[export_run].bodies("input") if i["name"] == "model"), None)
        runs = [ledger.runs[r] for r, _, role, b in ledger.index.entities(digest=model or "")
                if role == "input" and b.get("name") == "model"]
        runs = sorted((r for r in runs if r.stage == "evaluate" and r.status == "succeeded"),
                      key=lambda r: (r.records[0].time, r.run_id))
    for log in reversed(runs):
        out = next((o for o in log.bodies("output") if o["name"] == "harness_samples"), None)
        if out and (root / out["path"]).is_file() and hashing.file_digest(root / out["path"]) == out["digest"]:
            return Ours(log.run_id, log.path.resolve().relative_to(root.resolve()).as_posix(), out["path"])
    return None


def _scores(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample's per-item scores: its metrics whose values are whole numbers (acc, acc_norm, exact_match)."""
    return {m: sample[m] for m in sample.get("metrics", []) if isinstance(sample.get(m), bool | int)}


def _loglikelihoods(sample: dict[str, Any]) -> list[float]:
    """Each request's log-likelihood: ``resps`` holds ``[[ll, greedy]]`` per request (tuples in lm-eval's own
    samples, lists once written as JSON)."""
    seq = (list, tuple)
    return [float(r[0][0]) for r in sample.get("resps", []) if isinstance(r, seq) and r and isinstance(r[0], seq)
            and r[0] and isinstance(r[0][0], int | float) and not isinstance(r[0][0], bool)]


def _item(sample: dict[str, Any]) -> str:
    target = sample.get("target")
    return f"#{sample['doc_id']}" + (f" {json.dumps(target)[:40]}" if isinstance(target, str) else "")


def compare(root: Path, ours: Ours, theirs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per task that both scored: the items compared and differing, the first differing ones named, the
    largest absolute log-likelihood difference over all requests (nats), and the evaluate run."""
    from marin.ledger import exact

    mine: dict[str, dict[int, tuple[dict[str, Any], list[float]]]] = {}  # what is compared of each sample only
    for line in readers.lines(root / ours.samples, "samples", StageError):
        s = json.loads(line)
        if s.get("task") in theirs:
            mine.setdefault(s["task"], {})[int(s["doc_id"])] = (_scores(s), _loglikelihoods(s))
    out: dict[str, dict[str, Any]] = {}
    for task, samples in theirs.items():
        if task not in mine:
            continue
        differ, largest, n = [], 0.0, 0
        for s in sorted(samples, key=lambda s: s["doc_id"]):
            o = mine[task].get(int(s["doc_id"]))
            if o is None:
                continue
            n += 1
            if o[0] != _scores(s):
                differ.append(_item(s))
            a, b = o[1], _loglikelihoods(s)
            largest = max([largest, *(abs(x - y) for x, y in zip(a, b, strict=False))])
        out[task] = {"evaluate_run": ours.run_id, "items": n, "differing": len(differ),
                     "differing_items": ", ".join(differ[:NAMED]) + (f", and {len(differ) - NAMED} more"
                                                                     if len(differ) > NAMED else ""),
                     "largest_loglikelihood_difference": exact(largest)}
    return out


def record(root: Path, run: Any, ours: Ours, logs: dict[str, Any], who: str) -> None:
    """:func:`compare` with lm-eval's logs of the reference run, one ``agreement:<task>`` eval record each in
    ``run``; a task with differing items is said on the terminal with why."""
    for task, values in compare(root, ours, {t: v.get("samples", []) for t, v in logs.items()}).items():
        run.record("eval", {"name": f"{PREFIX}{task}", "split": "harness", "values": values})
        if values["differing"]:
            print(f"{who}: {task}: {values['differing']} of {values['items']} items score otherwise than evaluate "
                  f"run {ours.run_id} ({values['differing_items']}): {FRAMEWORKS}")
