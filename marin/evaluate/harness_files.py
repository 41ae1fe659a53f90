"""The harness's own files, as ``lm_eval --output_path --log_samples`` writes them: a results JSON
(per task: results, config, version, shots, higher-is-better, sample counts) and a samples JSONL
(one line per task and document: the document, target, requests, responses, per-sample metrics,
hashes), outputs of the evaluate run whose digests the ledger holds. Without lm-eval's wall-clock
and machine fields (date, timings, environment), so a replay writes them byte for byte again; each
sample line leads with its ``task``. :func:`first_difference` names the first sample two such
files disagree on (``marin verify``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import zip_longest
from pathlib import Path
from typing import Any

from marin import stages

_DECLARED = stages.declaration("evaluate")  # the paths: marin/stages/table.py
RESULTS, SAMPLES = _DECLARED.out("harness_results"), _DECLARED.out("harness_samples")
SECTIONS = ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples")


def _json(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str, ensure_ascii=False)


def results_json(logs: dict[str, Any], config: dict[str, Any], root: Path) -> bytes:
    """The results file: lm-eval's sections by task, and ``config`` (limit, seeds, versions)."""
    out: dict[str, Any] = json.loads(_json({k: {t: log[k] for t, log in logs.items() if k in log}
                                            for k in SECTIONS}))
    here = root.resolve()
    for cfg in out["configs"].values():  # a project-relative YAML path, as the eval record has it
        meta = cfg.get("metadata") if isinstance(cfg, dict) else None
        if isinstance(meta, dict) and "config_source" in meta:
            src = Path(str(meta["config_source"]))
            meta["config_source"] = src.relative_to(here).as_posix() if src.is_relative_to(here) else src.name
    out["config"] = config
    return (json.dumps(out, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def samples_jsonl(logs: dict[str, Any]) -> bytes:
    """The samples file: one line per task (in run order) and document (by doc id)."""
    lines = [_json({"task": task, **s}) for task, log in logs.items()
             for s in sorted(log.get("samples", []), key=lambda s: s["doc_id"])]
    return "".join(x + "\n" for x in lines).encode()


def first_difference(a: Iterable[bytes], b: Iterable[bytes]) -> str | None:
    """The first sample line on which two samples files (their lines) differ, in words ("line N:
    task T doc D: resps differ"), or None when every line is the same. Streams both."""
    for i, (x, y) in enumerate(zip_longest(a, b), start=1):
        if x == y:
            continue
        sx, sy = _parse(x), _parse(y)
        who = sx or sy or {}
        where = f"line {i}: task {who.get('task', '?')} doc {who.get('doc_id', '?')}"
        if sx is None or sy is None:
            return f"{where}: in one file only, or not a JSON object"
        keys = sorted(k for k in set(sx) | set(sy) if sx.get(k) != sy.get(k))
        return f"{where}: {', '.join(keys)} differ"
    return None


def _parse(line: bytes | None) -> dict[str, Any] | None:
    try:
        x = json.loads(line) if line is not None else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return x if isinstance(x, dict) else None
