"""``marin trace``: the maximal spans of a text that occur verbatim in the training data, with the
documents that hold them (OLMoTrace), searched in the index stage trace_index built.

An answer counts only for the model the index was built for: before searching, the index's recorded
``data/tokens`` digest (its trace_index run) must be the one the model's training run read, and for an
instruct model also its instruction train set, both looked up in the ledger; else one line naming both
digests. A text the tokenizer cannot encode (its ids do not decode back to it), an argument that is not
UTF-8, and a text over ``trace.max_query_tokens`` tokens are refused in one line; the search's memory is
linear in the text (:mod:`marin.evaluate.sa_search`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin import hashing, stages
from marin.errors import MarinError
from marin.evaluate.trace_index import Index
from marin.evaluate.tracing import encode, trace_ids
from marin.ledger.query import Ledger
from marin.ledger.store import NoSuchRun, RunLog, resolve_run_id
from marin.paths import relpath

INDEX, MODEL = stages.declaration("trace_index").out("trace_index"), Path(stages.MODEL)  # marin/stages/table.py
TOKENIZER = stages.declaration("evaluate_instruct").input("tokenizer")
# a text of more characters than this for each token of the cap is refused before it is encoded: tokenizing
# holds ~460 bytes a token (15 MB of text took 16.7 CPU s and 2.4 GB), and no text this long fits the cap
CHARS_PER_TOKEN = 16


class TraceRefused(MarinError):
    """The index is not that of the model's training data, the run has no samples, or the text is not
    one marin traces (not UTF-8, or too long)."""


def argument_text(text: str | None) -> str | None:
    """The TEXT argument, refused in one line when its bytes are not UTF-8 (Python hands them over as
    lone surrogates, which no tokenizer takes)."""
    if text is None:
        return None
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceRefused(f"the TEXT argument is not UTF-8 (byte {e.start}); pass UTF-8 text, or the file "
                           "with --file") from None


MIN_TOKENS_RANGE = (1, 4096)  # as schemas/params.schema.json bounds trace.min_tokens


def chosen_min_tokens(given: int | None, default: int) -> int:
    """``--min-tokens``, checked against the range params.yaml's trace.min_tokens has, else the default."""
    low, high = MIN_TOKENS_RANGE
    if given is None:
        return default
    if not low <= given <= high:
        raise TraceRefused(f"--min-tokens {given}: give a span length from {low} to {high} tokens")
    return given


def _capped(what: str, tokens: int, cap: int) -> None:
    if tokens > cap:
        raise TraceRefused(f"{what} is {tokens:,} tokens, over the {cap:,} `marin trace` takes "
                           "(trace.max_query_tokens); trace a shorter passage")


def _inputs(log: RunLog) -> dict[str, str]:
    return {b["name"]: b["digest"] for b in log.bodies("input")}


def _producer(ledger: Ledger, digest: str, what: str) -> RunLog:
    found = ledger.producers_of(digest)
    if not found:
        raise TraceRefused(f"{what} ({digest}) is no output any run in the ledger recorded; rebuild it with "
                           "`dvc repro` and commit the ledger")
    return found[-1][0]


def _trained_on(ledger: Ledger, model_log: RunLog) -> dict[str, tuple[str, str]]:
    """What a model's training read: {"tokens": (digest, run id), "instructions": (...)} through sft
    to its base model's train run."""
    stage, inputs = model_log.stage, _inputs(model_log)
    if stage == "sft":
        base = _producer(ledger, inputs["base_model"], "the base model of sft run " + model_log.run_id)
        return {**_trained_on(ledger, base), "instructions": (inputs["instructions"], model_log.run_id)}
    if stage != "train":
        raise TraceRefused(f"run {model_log.run_id} is a {stage} run, not a training run; trace a model")
    return {"tokens": (inputs["tokens"], model_log.run_id)}


@dataclass(frozen=True)
class Checked:
    """An index found to be that of a model's training data."""

    index: Index
    digest: str
    run_id: str
    trained_by: str


def check_index(root: Path, index_dir: Path, model_digest: str, model_name: str) -> Checked:
    """The index at ``index_dir``, once the ledger shows it indexes what the model was trained on."""
    with Ledger(root, sources=stages.SOURCE_STAGES, skip=("metric",)) as ledger:
        digest = hashing.digest_path(index_dir, ledger.hashes).digest
        index_log = _producer(ledger, digest, f"the index {relpath(root, index_dir)}")
        indexed = _inputs(index_log)
        trained = _trained_on(ledger, _producer(ledger, model_digest, model_name))
    pairs = {"tokens": "tokens", "instructions": "instructions_train"}
    for key, (want, run_id) in trained.items():
        have = indexed.get(pairs[key])
        if have != want:
            raise TraceRefused(f"the index (run {index_log.run_id}) was built from {key} {have}, but {model_name} "
                               f"was trained (run {run_id}) on {want}; rebuild it: `dvc repro trace_index`")
    return Checked(Index(index_dir), digest, index_log.run_id, trained["tokens"][1])


def render(result: dict[str, Any], min_tokens: int) -> str:
    """A trace as the terminal shows it."""
    lines = [f"trace: index {result['index']} (run {result['index_run']}), the training data of run "
             f"{result['trained_by']}; spans of at least {min_tokens} tokens"]
    for t in result["texts"]:
        share = t["covered"] / t["tokens"] if t["tokens"] else 0.0
        head = f"{t['label']}: " if t.get("label") else ""
        lines.append(f"{head}{len(t['spans'])} span(s) in {t['tokens']} tokens, {t['covered']} inside a span "
                     f"({share:.1%}), longest {t['longest']}")
        if not t["spans"] and t.get("longest_match"):  # no span: the nearest thing to one, so a reader sees it
            m = t["longest_match"]
            lines.append(f"  longest match, under {min_tokens} tokens: tokens {m['start']}-{m['start'] + t['longest']} "
                         f"({t['longest']}): {m['text']!r}; `--min-tokens {t['longest']}` traces it")
        for s in t["spans"]:
            lines.append(f"  tokens {s['start']}-{s['start'] + s['length']} ({s['length']}), {s['count']} "
                         f"occurrence(s), log10 unigram p {s['log10_unigram']:.1f}: {s['text']!r}")
            for d in s["documents"]:
                licence = (f"text {d['text_license']}, archive {d['license']}" if d.get("text_license")
                           else d["license"])
                lines.append(f"    {d['id']} ({d['source']}/{d['corpus']}, {licence}) at token "
                             f"{d['position']}: {d['snippet']!r}")
    return "\n".join(lines) + "\n"


def recorded_texts(root: Path, run_id: str) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """The model input a recorded run generated with, and each generated sample's (label, ids): the
    greedy samples of an evaluate run, the answers of an evaluate_instruct run."""
    try:
        run_id = resolve_run_id(root, run_id)  # a short id, as MLflow shows it, too
    except NoSuchRun as e:
        raise TraceRefused(str(e)) from None
    with Ledger(root, sources=stages.SOURCE_STAGES, skip=("metric",)) as ledger:
        log = ledger.runs[run_id]
    model = {"evaluate": "model", "evaluate_instruct": "instruct_model"}.get(log.stage)
    if model is None:
        raise TraceRefused(f"run {run_id} is a {log.start_body['stage']} run; --run traces the samples of an "
                           "evaluate or evaluate_instruct run")
    texts = [(f"{b['name']} #{i + 1}", np.array(s["token_ids"], dtype=np.int64))
             for b in log.bodies("eval") for i, s in enumerate(b.get("samples") or [])
             if "token_ids" in s and b["name"] != "constant_answer_instructions"]
    return _inputs(log)[model], texts


def text_licences(root: Path) -> dict[str, str]:
    """Each fetch source's texts' own licence where params.yaml states one (``fetch.sources[].text_license``):
    the index holds the archive's licence per document, the one it was obtained under."""
    from marin import config

    path = root / "params.yaml"
    sources = config.load(path).fetch.sources if path.is_file() else ()
    return {s.name: s.text_license for s in sources if s.text_license}


def run_command(root: Path, text: str | None, run_id: str | None, model: Path, index_dir: Path,
                min_tokens: int, max_tokens: int) -> dict[str, Any]:
    """What ``marin trace`` prints: the check, then the trace of the text or of a run's samples (each at
    most ``max_tokens`` tokens)."""
    from marin.data import tokenize as tk

    if text is not None and len(text) > CHARS_PER_TOKEN * max_tokens:
        raise TraceRefused(f"the text is {len(text):,} characters, more than {CHARS_PER_TOKEN} for each of the "
                           f"{max_tokens:,} tokens `marin trace` takes (trace.max_query_tokens); trace a shorter "
                           "passage")
    tok = tk.load(root / TOKENIZER)
    if run_id is not None:
        model_digest, texts = recorded_texts(root, run_id)
        name = f"the model of run {run_id}"
    else:
        path = model if model.is_absolute() else root / model
        model_digest, name = hashing.digest_path(path).digest, model.as_posix()
        texts = [("", encode(tok, text or ""))]
    for label, ids in texts:
        _capped(f"{label} of run {run_id}" if label else "the text", len(ids), max_tokens)
    checked = check_index(root, index_dir if index_dir.is_absolute() else root / index_dir, model_digest, name)
    traced = [{"label": label, **trace_ids(checked.index, tok, ids, min_tokens, show_longest=True)}
              for label, ids in texts]
    texts_own = text_licences(root)
    for d in (d for t in traced for s in t["spans"] for d in s["documents"] if d["source"] in texts_own):
        d["text_license"] = texts_own[d["source"]]
    return {"index": checked.digest, "index_run": checked.run_id, "trained_by": checked.trained_by,
            "min_tokens": min_tokens, "texts": traced}
