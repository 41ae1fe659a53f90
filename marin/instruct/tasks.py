"""The built-in instruction set: questions about the curated documents whose answers the
documents hold, each a conversation ``[user, assistant]``.

Every choice is a keyed hash (``instructions.salt``), so the set is a pure function of the
curated split and the params: for each document, every candidate example of the enabled tasks
is listed, and the ``per_document`` with the smallest keys are kept, in key order.

- ``corpus``: which corpus a line comes from (the curated ``corpus`` label);
- ``reference``: the book and chapter of a verse, in a document of verses (one per line) whose
  name ends ``#<Book> <chapter>``, as group_by names it (the Bible);
- ``quote``: the verse at ``<Book> <chapter>:<verse>``;
- ``speaker``: who speaks a line of a play (a heading ``NAME.`` on its own line, the speech below);
- ``continue``: the second half of a line of at least eight words, given the first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CHAPTER = re.compile(r"#(?P<book>\S(?:.*\S)?) (?P<chapter>\d+)$")
SPEAKER = re.compile(r"^(?P<name>[A-Z][A-Z' -]*[A-Z])\.$")
MIN_WORDS = 5  # a line shorter than this says too little to ask about
MAX_CHARS = 300  # nor is a longer one asked about: a tiny model's context is short


@dataclass(frozen=True)
class Doc:
    doc_id: str
    corpus: str
    name: str
    text: str


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.split("\n")]


def _askable(line: str) -> bool:
    return len(line.split()) >= MIN_WORDS and len(line) <= MAX_CHARS


def candidates(doc: Doc, tasks: tuple[str, ...]) -> Iterator[tuple[str, int, str, str]]:
    """(task, index, question, answer) of every example the document offers."""
    lines = _lines(doc.text)
    if "corpus" in tasks:
        for i, ln in enumerate(lines):
            if _askable(ln):
                yield "corpus", i, f"Which corpus is this line from? {ln}", doc.corpus
    chapter = CHAPTER.search(doc.name)
    if chapter is not None:
        ref = f"{chapter['book']} {chapter['chapter']}"
        for i, ln in enumerate(lines):
            if "reference" in tasks and _askable(ln):
                yield "reference", i, f"Name the book and chapter of this verse: {ln}", ref
            if "quote" in tasks and ln and len(ln) <= MAX_CHARS:
                yield "quote", i, f"Quote {ref}:{i + 1}.", ln
    if "speaker" in tasks:
        for i, ln in enumerate(lines[:-1]):
            m = SPEAKER.match(ln)
            if m is not None and _askable(lines[i + 1]) and not SPEAKER.match(lines[i + 1]):
                yield "speaker", i, f"Who speaks this line? {lines[i + 1]}", m["name"]
    if "continue" in tasks:
        for i, ln in enumerate(lines):
            words = ln.split()
            if len(words) >= 8 and len(ln) <= MAX_CHARS:
                half = len(words) // 2
                yield "continue", i, f"Continue this line: {' '.join(words[:half])}", " ".join(words[half:])


def key(salt: str, doc_id: str, task: str, index: int) -> bytes:
    return hashlib.sha256(f"{salt}\0{doc_id}\0{task}\0{index}".encode()).digest()


def examples(doc: Doc, tasks: tuple[str, ...], salt: str, per_document: int) -> list[dict[str, Any]]:
    """The document's ``per_document`` examples with the smallest keys, in key order."""
    drawn = sorted((key(salt, doc.doc_id, t, i), t, q, a) for t, i, q, a in candidates(doc, tasks))
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
             "task": t, "doc_id": doc.doc_id, "key": k.hex()} for k, t, q, a in drawn[:per_document]]
