"""The built-in harness tasks' data, cut deterministically from the curated validation split.

No test document leaks into training: every passage comes from a validation document
(data/curated/validation.parquet), and the wrong options of the multiple-choice task are words
of that split too. Which passages are cut, and the options and their order, follow from keyed
sha256 digests of the document ids, so the same curated split gives the same bytes.

- ``cloze`` (LAMBADA-style, Paperno et al. 2016): a run of ``CLOZE_WORDS`` words whose last
  word (letters only) is to be predicted from the words before it.
- ``cloze_shots``: more such passages, the pool the few-shot variant draws its examples from.
- ``next_word``: a run of ``NEXT_WORDS`` words and four candidates for its last word, the true
  one and three words of the same corpus whose counts in the validation split are nearest its
  own (frequency-matched, so a unigram model and a constant answer stay near chance, 0.25, and
  only a model of the words before it does better).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CLOZE_WORDS, NEXT_WORDS = 24, 20  # different lengths: different passages of the same document
PER_DOC = 4  # passages cut from each document, at most
CLOZE_N, SHOTS_N, NEXT_N = 400, 64, 400  # items kept per file, at most
SALT = "marin-evalsets-v1"


@dataclass(frozen=True)
class Doc:
    doc_id: str
    corpus: str
    name: str
    license: str
    text: str


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


def by_count(docs: Iterable[Doc]) -> dict[str, list[str]]:
    """Per corpus, its candidate words (letters only, 3 or more) ordered by their count in
    ``docs``, then by key: the order in which :func:`distractors` finds neighbours."""
    counts: dict[str, Counter[str]] = {}
    for d in docs:
        counts.setdefault(d.corpus, Counter()).update(w for w in d.text.split() if w.isalpha() and len(w) >= 3)
    return {c: sorted(cs, key=lambda w, cs=cs: (cs[w], key("word", w))) for c, cs in counts.items()}


def distractors(truth: str, ordered: list[str], at: int, k: str, n: int = 3, window: int = 8) -> list[str]:
    """``n`` words of nearly the same count as ``truth`` (``ordered[at]``, :func:`by_count`): of the
    ``window`` words on each side of it, other than it ignoring case, the ``n`` with the smallest
    key ``k``."""
    near = ordered[max(at - window, 0):at] + ordered[at + 1:at + 1 + window]
    return sorted((w for w in near if w.casefold() != truth.casefold()), key=lambda w: key(k, w))[:n]


def next_word_items(docs: list[Doc]) -> list[dict[str, Any]]:
    """Four-way questions: the words of a passage before its last, and four candidates for the
    last (:func:`distractors`), ordered by key."""
    ordered, items = by_count(docs), []
    at = {c: {w: i for i, w in enumerate(ws)} for c, ws in ordered.items()}
    for d in docs:
        for s, ws in passages(d, NEXT_WORDS):
            k = key("next_word", d.doc_id, s)
            others = distractors(ws[-1], ordered[d.corpus], at[d.corpus][ws[-1]], k)
            if len(others) < 3:
                continue
            choices = sorted([ws[-1], *others], key=lambda w: key(k, "order", w))
            items.append({"id": k, "doc_id": d.doc_id, "corpus": d.corpus, "license": d.license,
                          "context": " ".join(ws[:-1]), "choices": choices, "gold": choices.index(ws[-1])})
    return sorted(items, key=lambda it: it["id"])


def build(validation: list[Doc]) -> dict[str, list[dict[str, Any]]]:
    """The files of data/evalsets by name: the cloze passages, the first eighth by key (at least 2
    of 4 or more) going to the few-shot pool ``cloze_shots`` instead (passages never overlap), and
    the next-word questions."""
    cloze = cloze_items(validation)
    n_shots = min(SHOTS_N, max(len(cloze) // 8, min(2, len(cloze) // 2)))
    return {"cloze": cloze[n_shots:][:CLOZE_N], "cloze_shots": cloze[:n_shots],
            "next_word": next_word_items(validation)[:NEXT_N]}


def jsonl(items: list[dict[str, Any]]) -> bytes:
    """One JSON object per line, keys sorted: the same items give the same bytes."""
    return "".join(json.dumps(it, sort_keys=True, ensure_ascii=False) + "\n" for it in items).encode()
