"""The Benchmarks table that the report, its card and the export's card all show: each lm-evaluation-harness
result beside its baselines (chance, the unigram model of the train tokens on the same requests, the best
constant answer), its stderr, its 2-stderr mark against the best of them (:func:`marin.evaluate.baselines.mark`),
its score on the clean items (stage decontaminate's findings), the samples and the shots.

One renderer, two kinds of cell. The report and its card (:mod:`marin.report.harness_section`) pass rows of
ledger fact ids and a renderer that links each to its source; the export's card (``models/hf/README.md``, which
``hf upload`` sends) passes :func:`rows` of metrics/eval.json and its context file, the values themselves,
rendered by :func:`plain`. A missing cell is ``None`` in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from marin.evaluate import baselines as bl
from marin.evaluate.metrics_file import is_measurement

Render = Callable[[Any], str]  # a cell as printed: a fact id as a link, or a value as text
HEADING = "### Benchmarks (lm-evaluation-harness)"
BASELINES = ("chance", "unigram", "constant")  # the keys of a row's baselines, as metrics/eval.json prefixes them
COUNTS = ("samples", "items", "limit", "num_fewshot", "contaminated", "excluded", "dataset", "dataset_split")
CLEAN = (" Clean items: the score on the items that share no n-gram (decontaminate.ngram words) with the "
         "training data, as stage decontaminate found them (evaluate.decontaminate: report), and how many it found "
         "contaminated; under exclude only the clean items were scored.")


def plain(x: Any) -> str:
    """A value as the export's card prints it: a float to four places, a missing one as "not recorded"."""
    return "not recorded" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)


def measured(vals: dict[str, Any]) -> list[str]:
    """A task's metric names in metrics/eval.json (no stderr, baseline, clean score or setting), sorted."""
    return sorted(k for k, v in vals.items() if is_measurement(k, v) and "/" not in k and not k.endswith("_stderr"))


def _num(vals: dict[str, Any], key: str) -> float | None:
    v = vals.get(key)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def rows(eval_json: dict[str, Any]) -> list[dict[str, Any]]:
    """metrics/eval.json's harness results (merged with evals/eval_context.json: :func:`metrics_file.read`) as
    the table's rows, one per task and metric, each with its mark against the best recorded baseline."""
    out = []
    for task, vals in sorted((eval_json.get("harness") or {}).items()):
        for m in measured(vals):
            row = {"task": task, "metric": m, "value": vals[m], "stderr": _num(vals, f"{m}_stderr"),
                   **{k: _num(vals, f"{k}/{m}") for k in (*BASELINES, "clean")},
                   **{k: vals.get(k) for k in COUNTS}, "decontamination": vals.get("decontamination_ngram")}
            known = [row[k] for k in BASELINES if row[k] is not None]
            row["mark"] = bl.mark(row["value"], row["stderr"], str(vals.get(f"better/{m}", "higher")), known)
            out.append(row)
    return out


def table(rows: list[dict[str, Any]], v: Render, source: str, failed: Iterable[dict[str, Any]] = ()) -> list[str]:
    """The Benchmarks subsection (Markdown lines): the table of ``rows`` (:func:`rows`, or the report's rows of
    fact ids), how each stderr was computed where the rows say, and each task in ``failed`` with its error;
    ``source`` names where the results come from (the evaluate run, or metrics/eval.json)."""
    failed = list(failed)
    if not (rows or failed):
        return []
    clean = any(r.get("decontamination") is not None for r in rows)  # a column only where evaluate had the findings
    out = [HEADING, "",
           f"Tasks run by lm-evaluation-harness on the JAX model itself ({source}): the built-in tasks' data cut "
           "from the validation split only, a registry task's its own Hub dataset, pinned in the project. "
           "Baselines: chance is the task's stated level (else one over the number of choices); the unigram "
           "baseline is the same requests scored by the add-one unigram model of the train tokens (the baseline of "
           "the bits per byte), which ignores the context; the constant answer is the best score of one answer "
           "given to every sample (the majority class, chosen with the answers in hand). A result not beyond two "
           f"stderr better than the best of them is marked **{bl.SAME}** (or **{bl.WORSE}**). Samples: those "
           "scored, of the task's items, and the limit (evaluate.harness.limit) where one is set."
           + (CLEAN if clean else ""), "",
           "| task | metric | chance | unigram baseline | constant answer | model | ± stderr | against baseline "
           f"|{' clean items |' if clean else ''} samples | shots |", "|" + "---|" * (11 if clean else 10)]
    out += [_row(v, r, clean) for r in rows] + [""]
    out += _stderr_methods(v, rows)
    for x in failed:
        out += [f"`{x['task']}` did not run: {v(x['error'])}", ""]
    return out


def _row(v: Render, r: dict[str, Any], clean: bool) -> str:
    def cell(key: str, none: str = "–") -> str:
        return v(r[key]) if r.get(key) is not None else none

    shown = cell("mark")
    mark = f"**{shown}**" if r.get("mark") is not None and bl.BETTER not in shown else shown  # the text is the mark
    n = f"{v(r.get('samples'))} of {v(r['items'])}" if r.get("items") is not None else v(r.get("samples"))
    n += f" (limit {v(r['limit'])})" if r.get("limit") is not None else ""
    return (f"| `{r['task']}` | {r['metric']} | {cell('chance')} | {cell('unigram', 'n/a')} | "
            f"{cell('constant', 'n/a')} | {v(r['value'])} | {cell('stderr')} | {mark} | "
            f"{_clean(v, r) + ' | ' if clean else ''}{n} | {v(r.get('num_fewshot'))} |")


def _clean(v: Render, r: dict[str, Any]) -> str:
    """The clean-items cell: the clean subset's score and how many items were contaminated, or excluded."""
    if r.get("clean") is not None:
        return f"{v(r['clean'])} ({v(r.get('contaminated'))} contaminated)"
    if r.get("excluded") is not None:
        return f"only these ({v(r['excluded'])} excluded)"
    return "–"


def _stderr_methods(v: Render, rows: list[dict[str, Any]]) -> list[str]:
    """One line naming how each metric's stderr was computed (the first row of that metric that says)."""
    seen: dict[str, Any] = {}
    for metric, method in sorted((r["metric"], r["stderr_method"]) for r in rows if r.get("stderr_method")):
        seen.setdefault(metric, method)
    if not seen:
        return []
    return ["How each stderr was computed: " + "; ".join(f"{m}: {v(x)}" for m, x in seen.items()) + ".", ""]
