"""The evaluate stages' DVC metrics files hold only measurements of the model; what those are measured
against and how goes beside them, in a context file that is an output but not a DVC metric.

``dvc exp show`` and ``dvc metrics diff`` make a column of every value of a metrics file, so a task's
chance level, its best constant answer, the unigram baseline, which way is better, sample counts,
shots and seeds sat there as if each experiment had measured them. A value is a measurement when it
is a float that is not a baseline (``chance/``, ``constant/``, ``unigram/``, ``unigram_…``) nor a
setting (``limit``): scores, their stderrs, bits per byte, perplexity. Everything else (counts and
settings are integers or strings) goes to the context file under the same keys. :func:`read` merges
the two back into the one document every reader had (the export cards, ``marin reference``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import fsutil, readers
from marin.errors import MarinError

if TYPE_CHECKING:
    from marin.ledger import Run

BASELINES = ("chance/", "constant/", "unigram/", "unigram_")  # a task's or the data's own levels
SETTINGS = ("limit",)  # lm-eval's limit may be a float (a fraction of the items)


def is_measurement(key: str, value: object) -> bool:
    """A float that measures the model: not a baseline, a setting or a count."""
    return isinstance(value, float) and not key.startswith(BASELINES) and key not in SETTINGS


def split(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(measurements, the rest) of a metrics document, each keeping the nesting; a baseline's whole
    subtree (``unigram_per_corpus``) is context."""
    metrics: dict[str, Any] = {}
    context: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) and not k.startswith(BASELINES):
            m, c = split(v)
            if m:
                metrics[k] = m
            if c:
                context[k] = c
        elif is_measurement(k, v):
            metrics[k] = v
        else:
            context[k] = v
    return metrics, context


def merge(metrics: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The one document :func:`split` took apart (keys sorted, as the files are)."""
    out = dict(metrics)
    for k, v in context.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return dict(sorted(out.items()))


def write(root: Path, run: Run, doc: dict[str, Any], metrics: tuple[str, Path], context: tuple[str, Path]) -> None:
    """Write ``doc`` as its metrics file and its context file (each (output name, path)), each recorded
    as an output of ``run`` before it is published."""
    for (name, path), part in zip((metrics, context), split(doc), strict=True):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_bytes(root / path, (json.dumps(part, indent=2, sort_keys=True) + "\n").encode(),
                           before_publish=lambda tmp, n=name, p=path: run.output(n, p, source=tmp))


def read(root: Path, metrics: Path, context: Path, error: type[MarinError]) -> dict[str, Any]:
    """The metrics file merged with its context file (none beside a metrics file written before the split)."""
    doc = readers.read_json(root / metrics, "json", error)
    extra = readers.read_json(root / context, "json", error) if (root / context).is_file() else {}
    return merge(doc, extra)
