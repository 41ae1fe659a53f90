"""lm-eval's per-sample log (``evals/harness/samples.jsonl``) as an MLflow evaluation table of the evaluate
run (``MlflowClient.log_table``, the artifact ``eval_results_table.json`` that ``mlflow.evaluate`` writes
too): one row per task and document, with its input, target, the model's response and each of the
task's per-sample metrics; ``mlflow.load_table`` reads it back and the run's Artifacts tab shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marin import hashing, readers

TABLE = "eval_results_table.json"  # mlflow.evaluate's own name for its per-row results
MAX_ROWS = 20_000  # the shipped run logs 1,200; a bigger log is cut and the run's tag says so
MAX_CELL = 2_000  # characters of a context or response kept in a cell


def rows(path: Path) -> tuple[dict[str, list[Any]], int]:
    """The table's columns (at most MAX_ROWS rows) and the number of samples in the file."""
    kept, n = [], 0
    for line in readers.lines(path, "samples"):  # streamed: only the kept rows are held
        if line.strip():
            n += 1
            if n <= MAX_ROWS:
                kept.append(json.loads(line))
    metrics = sorted({m for s in kept for m in s.get("metrics", [])})
    table: dict[str, list[Any]] = {k: [] for k in ("task", "doc_id", "input", "target", "response", *metrics)}
    for s in kept:
        args = s.get("arguments") or [[""]]
        table["task"].append(s.get("task", ""))
        table["doc_id"].append(s.get("doc_id"))
        table["input"].append(_cell(args[0][0] if args and args[0] else ""))
        table["target"].append(_cell(s.get("target", "")))
        table["response"].append(_cell(s.get("filtered_resps", s.get("resps"))))
        for m in metrics:
            table[m].append(s.get(m))
    return table, n


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def log_samples(client: Any, run_id: str, path: Path, digest: str) -> None:
    """The samples file as the run's evaluation table, when the file on disk is the recorded one."""
    if hashing.file_digest(path) != digest:
        client.set_tag(run_id, "marin.eval_table", f"not logged: {path.name} on disk is not the recorded version")
        return
    table, n = rows(path)
    client.log_table(run_id, data=table, artifact_file=TABLE)
    kept = len(table["task"])
    client.set_tag(run_id, "marin.eval_table", f"{TABLE}: {kept} of {n} samples of {path.name}")
