"""The evaluate stages' DVC metrics files hold each evaluation's headline scores; everything else they
measured, and what those are measured against and how, goes beside them, in a context file that is
an output but not a DVC metric.

``dvc exp show`` and ``dvc metrics diff`` make a column of every value of a metrics file. With chance
levels, sample counts, shots and seeds there they read as if each experiment had measured them, and
with every stderr, decontaminated score and per-corpus or per-task breakdown the table ran to 55 metric
columns. A value is a measurement when it is a float that is not a baseline (``chance/``, ``constant/``,
``unigram/``, ``unigram_…``) nor a setting (``limit``); a measurement is a headline when the writer's rule
says so (:func:`evaluation_headline`, :func:`instructions_headline`). The metrics file holds the
headlines; the context file the rest under the same keys. :func:`read` merges the two back into the
one document every reader had (the export cards, the report, ``marin reference``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import fsutil, readers
from marin.errors import MarinError
from marin.headline import BASELINES, INSTRUCTION_SCORES, is_measurement, task_headline

if TYPE_CHECKING:
    from marin.ledger import Run

# A headline rule: (the key's path, the mapping that holds it) -> whether its value goes to the metrics file
Headline = Callable[[tuple[str, ...], dict[str, Any]], bool]


def evaluation_headline(path: tuple[str, ...], holder: dict[str, Any]) -> bool:
    """Validation bits per byte and each harness task's headline (:func:`task_headline`)."""
    return path == ("bits_per_byte",) or (len(path) == 3 and path[0] == "harness"
                                           and path[2] == task_headline(holder))


def instructions_headline(path: tuple[str, ...], holder: dict[str, Any]) -> bool:
    """Each model's token and choice accuracy over all held-out instructions (not per task)."""
    return len(path) == 2 and path[1] in INSTRUCTION_SCORES


def split(doc: dict[str, Any], headline: Headline = lambda path, holder: True,
          at: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(headline measurements, the rest) of a metrics document, each keeping the nesting; a baseline's
    whole subtree (``unigram_per_corpus``) is context."""
    metrics: dict[str, Any] = {}
    context: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) and not k.startswith(BASELINES):
            m, c = split(v, headline, (*at, k))
            if m:
                metrics[k] = m
            if c:
                context[k] = c
        elif is_measurement(k, v) and headline((*at, k), doc):
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


def write(root: Path, run: Run, doc: dict[str, Any], metrics: tuple[str, Path], context: tuple[str, Path],
          headline: Headline) -> None:
    """Write ``doc`` as its metrics file (the values ``headline`` picks) and its context file (each
    (output name, path)), each recorded as an output of ``run`` before it is published."""
    for (name, path), part in zip((metrics, context), split(doc, headline), strict=True):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_bytes(root / path, (json.dumps(part, indent=2, sort_keys=True) + "\n").encode(),
                           before_publish=lambda tmp, n=name, p=path: run.output(n, p, source=tmp))


def read(root: Path, metrics: Path, context: Path, error: type[MarinError]) -> dict[str, Any]:
    """The metrics file merged with its context file (none beside a metrics file written before the split)."""
    doc = readers.read_json(root / metrics, "json", error)
    extra = readers.read_json(root / context, "json", error) if (root / context).is_file() else {}
    return merge(doc, extra)
