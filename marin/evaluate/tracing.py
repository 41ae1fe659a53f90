"""A text traced to the training documents it repeats: its maximal verbatim spans in the trace index
(:mod:`marin.evaluate.trace_index`), rarest first, each with its documents and a snippet of each with
the span marked; what ``marin trace`` prints and evaluate and evaluate_instruct record for their samples."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from marin import stages
from marin.evaluate.trace_index import INDEX_JSON, Index, Span, TraceError, tokens_covered, unigram_rank

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from marin.ledger import Run

MARK = ("\u00ab", "\u00bb")  # « and »: a span's ends in its snippet


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """``text``'s token ids, refused in one line when they do not decode back to it."""
    if not text:
        raise TraceError("the text to trace is empty; give a TEXT, --file or --run")
    ids = tok.encode(text, add_special_tokens=False).ids
    back = tok.decode(ids, skip_special_tokens=False)
    if back != text:
        at = next((i for i, (a, b) in enumerate(zip(text, back, strict=False)) if a != b), min(len(text), len(back)))
        raise TraceError(f"the tokenizer cannot encode this text: it reads back differently from character "
                         f"{at + 1} ({text[at:at + 12]!r}); trace text of the tokenizer's alphabet")
    return np.array(ids, dtype=np.int64)


def _document(index: Index, tok: Tokenizer, span: Span, pos: int) -> dict[str, Any]:
    row, at = index.locate(pos)
    before, inside, after = index.context(pos, span.length, row)
    snippet = tok.decode(before.tolist()) + MARK[0] + tok.decode(inside.tolist()) + MARK[1] + tok.decode(
        after.tolist())
    return {"id": row["id"], "corpus": row["corpus"], "source": row["source"], "license": row["license"],
            "position": at, "snippet": snippet}


def trace_ids(index: Index, tok: Tokenizer, ids: np.ndarray, min_tokens: int,
              show_longest: bool = False) -> dict[str, Any]:
    """The trace of one text's ids: its spans, rarest first, with their documents (``show_longest``: and
    the longest verbatim run's text and start, span or not, as ``marin trace`` prints it)."""
    matches = index.longest(ids)
    spans = unigram_rank(index.spans(ids, min_tokens, matches))
    longest = int(matches.max(initial=0))  # the longest verbatim run, a span or shorter
    out = [{"start": s.start, "length": s.length, "text": tok.decode(ids[s.start:s.start + s.length].tolist()),
            "count": s.count, "log10_unigram": s.log10_unigram,
            "documents": [_document(index, tok, s, p) for p in s.hits]} for s in spans]
    at = next((k for k, s in enumerate(spans) if s.length == longest), None)  # None: shorter than any span
    traced = {"tokens": len(ids), "covered": tokens_covered(spans, len(ids)), "longest": longest, "longest_at": at,
              "spans": out}
    if show_longest and longest:
        start = int(np.argmax(matches))
        traced["longest_match"] = {"start": start, "text": tok.decode(ids[start:start + longest].tolist())}
    return traced


INDEX = stages.declaration("trace_index").out("trace_index")  # marin/stages/table.py
TOKENIZER = stages.declaration("evaluate_instruct").input("tokenizer")


def indexed(root: Path) -> bool:
    """Whether the project holds a complete trace index (stage trace_index ran)."""
    return (root / INDEX / INDEX_JSON).is_file()


def record_samples(root: Path, run: Run, sets: Mapping[str, Sequence[Mapping[str, Any]]], out: Path,
                   min_tokens: int) -> None:
    """Trace each set's samples (their ``token_ids``) and write ``out`` (recorded as output ``trace_samples``):
    per sample its spans of at least ``min_tokens`` tokens, the longest, and the tokens inside spans; without
    an index, a file that says so (evaluate then records no trace)."""
    from marin import fsutil
    from marin.data import tokenize as tk

    doc: dict[str, Any] = {"kind": "trace", "min_tokens": min_tokens, "traced": indexed(root)}
    if doc["traced"]:
        index, tok = Index(root / INDEX), tk.load(root / TOKENIZER)
        doc["sets"] = {name: [{"prompt": s["prompt"], **trace_ids(index, tok, np.array(s["token_ids"],
                                                                                         dtype=np.int64), min_tokens)}
                              for s in samples] for name, samples in sets.items()}
        every = [t for ts in doc["sets"].values() for t in ts]
        doc["tokens"], doc["covered"] = sum(t["tokens"] for t in every), sum(t["covered"] for t in every)
    data = (json.dumps(doc, ensure_ascii=False, indent=1, sort_keys=True) + "\n").encode()
    fsutil.write_bytes(root / out, data, before_publish=lambda tmp: run.output("trace_samples", out, source=tmp))
