"""Stage decontaminate: every harness task's items checked against the training data by n-gram
overlap (:mod:`marin.evaluate.ngrams`: 13-grams of lowercased alphanumeric words, as GPT-3 and
OLMo). The training data is the curated train split and the instruction train set; it is indexed
in a temporary folder (a build artifact, never an output) in memory bounded by a batch. Writes
data/decontamination.json: per task its items, how many are contaminated, their fraction and the
ids (lm-eval's doc ids, the item's place in the task's test split), which evaluate reads
(``evaluate.decontaminate``: report, or exclude); one eval record per task (``decontamination:<task>``).

An item is the text the model is asked to score: the task's prompt for it (``doc_to_text``) and its
answer (``doc_to_target``; a multiple-choice item's gold choice). Few-shot examples are not items."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin import fsutil, stages
from marin.config import HarnessParams, Params
from marin.evaluate import harness_run, ngrams, training_data
from marin.ledger import Input, Recipe, Run, exact
from marin.ledger.bodies import Exact
from marin.stages import task_files

CURATED_TRAIN, INSTRUCTIONS_TRAIN = training_data.CURATED_TRAIN, training_data.INSTRUCTIONS_TRAIN
_DECLARED = stages.declaration("decontaminate")  # the paths below: marin/stages/table.py
EVALSETS, OUT = _DECLARED.input("evalsets"), _DECLARED.out("decontamination")
NORMALIZATION = "casefold; words are runs of Unicode letters and digits ([^\\W_]+)"


def run_stage(root: Path, params: Params) -> None:
    """The decontaminate stage: harness items against the training data, as a ledger run."""
    hp, n = params.evaluate.harness, params.decontaminate.ngram
    inputs = [Input("curated_train", CURATED_TRAIN.as_posix()),
              Input("instructions_train", INSTRUCTIONS_TRAIN.as_posix())]
    if (root / EVALSETS).is_dir():  # else the built-in tasks are named as not checked, each in one line
        inputs.append(Input("evalsets", EVALSETS.as_posix()))
    inputs += [Input(f"task:{p}", p) for p in task_files.listed_paths(root, hp, "decontaminate")]
    recorded = {"decontaminate": {"ngram": n}, "evaluate": {"harness": params.raw["evaluate"].get("harness", {})}}
    recipe = Recipe("decontaminate", recorded, inputs, closure=stages.code_files(root, "decontaminate"))
    with Run.start(root, recipe) as run:
        items = task_items(root, hp)
        (root / ".marin").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="decontaminate-", dir=root / ".marin") as index:
            built = ngrams.build(training_texts(root), n, Path(index))
            tasks = {name: check(Path(index), got, n) if isinstance(got, list) else {"error": got}
                     for name, got in items.items()}
        for name, t in tasks.items():
            values: dict[str, Exact | int | str] = {
                k: exact(v) if isinstance(v, float) else v for k, v in t.items() if k != "ids"}
            run.record("eval", {"name": f"decontamination:{name}", "split": harness_run.SPLIT, "values": values})
        report = {"kind": "decontamination", "ngram": n, "normalization": NORMALIZATION, "training": built,
                  "tasks": tasks}
        data = (json.dumps(report, indent=1, sort_keys=True) + "\n").encode()
        fsutil.write_bytes(root / OUT, data, before_publish=lambda tmp: run.output("decontamination", OUT, source=tmp))
    print(f"decontaminate: {built['ngrams']:,} {n}-grams of {built['documents']:,} training documents indexed")
    for name, t in tasks.items():
        if "error" in t:
            print(f"marin: error: {t['error']}", file=sys.stderr)
        else:
            print(f"decontaminate: {name}: {t['contaminated']} of {t['items']} items contaminated "
                  f"({t['fraction']:.1%}), {t['short']} under {n} words")


def check(index: Path, items: list[list[str]], n: int) -> dict[str, Any]:
    """One task's counts and contaminated ids."""
    dirty, short = ngrams.contaminated(index, items, n)
    ids = [i for i, d in enumerate(dirty) if d]
    return {"items": len(items), "short": sum(short), "contaminated": len(ids),
            "fraction": len(ids) / len(items) if items else 0.0, "ids": ids}


def training_texts(root: Path) -> Iterator[str]:
    """The training documents: the curated train split's texts, then each instruction train
    example's messages joined by newlines."""
    yield from (r["text"] for r in training_data.curated_rows(root, ["text"]))
    yield from (text for _, text in training_data.instructions(root))


def task_items(root: Path, hp: HarnessParams) -> dict[str, list[list[str]] | str]:
    """Each task's items as normalized words, in doc-id order, or why it could not be loaded."""
    out: dict[str, list[list[str]] | str] = {}
    with harness_run.offline(root), contextlib.redirect_stderr(io.StringIO()), \
            contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory(prefix="marin-tasks-") as scratch:
        names, tm, refused = harness_run.task_manager(root, hp, Path(scratch))
        for name in names:
            task, error = (None, refused[name]) if name in refused else harness_run.load_task(root, tm, name)
            out[name] = error.replace("harness task", "decontaminate: task", 1) if error else [
                ngrams.words(text) for text in item_texts(task)]
    return out


def item_texts(task: Any) -> Iterator[str]:
    """The prompt and answer of each of ``task``'s items, in lm-eval's doc order."""
    for doc in task.eval_docs:
        target = task.doc_to_target(doc)
        if task.OUTPUT_TYPE == "multiple_choice" and isinstance(target, int):
            target = task.doc_to_choice(doc)[target]
        yield f"{task.doc_to_text(doc)} {' '.join(map(str, target)) if isinstance(target, list) else target}"
