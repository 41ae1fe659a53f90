"""The built-in harness tasks' data, cut deterministically from the curated validation split.

No test document leaks into training: every passage comes from a validation document
(data/curated/validation.parquet). Only the *names* of the works of both splits are read, to
draw the wrong options of the multiple-choice task. Which passages are cut, and the order of
the options, follow from keyed sha256 digests of the document ids, so the same curated split
gives the same bytes.

- ``cloze`` (LAMBADA-style, Paperno et al. 2016): a run of ``CLOZE_WORDS`` words whose last
  word (letters only) is to be predicted from the words before it.
- ``cloze_shots``: more such passages, the pool the few-shot variant draws its examples from.
- ``source``: a passage of ``SOURCE_WORDS`` words and four works; which one it comes from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

CLOZE_WORDS, SOURCE_WORDS = 24, 24
PER_DOC = 4  # passages cut from each document, at most
CLOZE_N, SHOTS_N, SOURCE_N = 400, 64, 400  # items kept per file, at most
SALT = "marin-evalsets-v1"


@dataclass(frozen=True)
class Doc:
    doc_id: str
    corpus: str
    name: str
    license: str
    text: str


def work(name: str) -> str:
    """The work a curated document belongs to, from its ``name``: a grouped JSONL record's group
    less its last key (``...kjv.jsonl#Genesis 14`` -> ``Genesis``), else the file's title
    (``.../merchant_of_venice_gut.txt`` -> ``Merchant Of Venice``)."""
    if "#" in name:
        group = name.rsplit("#", 1)[1]
        return group.rsplit(" ", 1)[0] if " " in group else group
    stem = PurePosixPath(name).stem
    return stem.removesuffix("_gut").replace("_", " ").strip().title()


def key(*parts: object) -> str:
    """A keyed digest that orders and draws everything here."""
    return hashlib.sha256(":".join([SALT, *map(str, parts)]).encode()).hexdigest()


def passages(doc: Doc, n_words: int) -> list[tuple[int, list[str]]]:
    """Up to ``PER_DOC`` non-overlapping runs of ``n_words`` words (fewer, down to 8, in a document
    too short for ``PER_DOC`` of them), each ending on a word of 3 or more letters only, chosen by
    key among all such runs; (start word, words)."""
    words = doc.text.split()
    n_words = max(8, min(n_words, len(words) // PER_DOC))
    ends = [e for e in range(n_words - 1, len(words)) if words[e].isalpha() and len(words[e]) >= 3]
    chosen: list[int] = []
    for e in sorted(ends, key=lambda e: key(doc.doc_id, n_words, e)):
        if all(abs(e - c) >= n_words for c in chosen):
            chosen.append(e)
        if len(chosen) == PER_DOC:
            break
    return [(e - n_words + 1, words[e - n_words + 1:e + 1]) for e in sorted(chosen)]


def cloze_items(docs: Iterable[Doc]) -> list[dict[str, Any]]:
    """Every cloze passage of ``docs``, ordered by key."""
    items = [{"id": key("cloze", d.doc_id, s), "doc_id": d.doc_id, "corpus": d.corpus, "license": d.license,
              "context": " ".join(ws[:-1]), "target": ws[-1]}
             for d in docs for s, ws in passages(d, CLOZE_WORDS)]
    return sorted(items, key=lambda it: it["id"])


def source_items(docs: Iterable[Doc], works: dict[str, str]) -> list[dict[str, Any]]:
    """Four-way questions: a passage and its work among three others (``works``: work -> corpus;
    wrong options from the passage's own corpus first), ordered by key."""
    items = []
    for d in docs:
        truth = work(d.name)
        for s, ws in passages(d, SOURCE_WORDS):
            k = key("source", d.doc_id, s)
            others = sorted((w for w in works if w != truth),
                            key=lambda w: (works[w] != d.corpus, key(k, w)))[:3]
            if len(others) < 3:
                continue
            choices = sorted([truth, *others], key=lambda w: key(k, "order", w))
            items.append({"id": k, "doc_id": d.doc_id, "corpus": d.corpus, "license": d.license,
                          "passage": " ".join(ws), "choices": choices, "gold": choices.index(truth)})
    return sorted(items, key=lambda it: it["id"])


def build(validation: list[Doc], works: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The files of data/evalsets by name: the cloze passages, the first eighth by key (at least 2
    of 4 or more) going to the few-shot pool ``cloze_shots`` instead (passages never overlap), and
    the source questions."""
    cloze = cloze_items(validation)
    n_shots = min(SHOTS_N, max(len(cloze) // 8, min(2, len(cloze) // 2)))
    return {"cloze": cloze[n_shots:][:CLOZE_N], "cloze_shots": cloze[:n_shots],
            "source": source_items(validation, works)[:SOURCE_N]}


def jsonl(items: list[dict[str, Any]]) -> bytes:
    """One JSON object per line, keys sorted: the same items give the same bytes."""
    return "".join(json.dumps(it, sort_keys=True, ensure_ascii=False) + "\n" for it in items).encode()
