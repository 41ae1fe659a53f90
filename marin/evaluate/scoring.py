"""Evaluation: bits per byte and perplexity on the validation split (whole and per
corpus), a unigram baseline on the same tokens, and greedy samples.

Each validation document is scored on its own, window by window
(:func:`marin.data.documents.windows`): every document token is predicted exactly once,
from at most ``seq_len`` tokens of its own document. Bits per byte divide the
summed negative log-likelihood (in bits) by the document's UTF-8 bytes, so the number
does not depend on the tokenizer (Gao et al. 2020, "The Pile", section 3.2).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from marin.data.documents import windows


@dataclass
class Tally:
    nll_nats: float = 0.0
    tokens: int = 0
    bytes: int = 0
    docs: int = 0

    def add(self, nll: float, tokens: int, n_bytes: int) -> None:
        self.nll_nats += nll
        self.tokens += tokens
        self.bytes += n_bytes
        self.docs += 1

    @property
    def bits_per_byte(self) -> float:
        return self.nll_nats / math.log(2) / self.bytes if self.bytes else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_nats / self.tokens) if self.tokens else float("nan")


@dataclass
class _Doc:
    """A document whose windows are being scored."""

    tokens: int
    corpus: str
    n_bytes: int
    left: int  # windows not yet scored
    nll: float = 0.0


def score(nll_fn: Any, params: Any, docs: Iterable[tuple[np.ndarray, str, int]], eos_id: int, seq_len: int,
          batch_size: int) -> dict[str, Tally]:
    """Tallies per corpus and overall (key ``""``) for (token ids, corpus, bytes) docs.

    Windows of consecutive documents fill fixed batches in order; only one batch and the
    documents it touches are held. Each document's NLL is summed window by window and
    tallied in document order, once all its windows are scored."""
    tallies: dict[str, Tally] = defaultdict(Tally)
    pending: deque[_Doc] = deque()
    rows: list[tuple[_Doc, np.ndarray, np.ndarray, int]] = []

    def tally_finished() -> None:
        while pending and pending[0].left == 0:
            d = pending.popleft()
            for key in ("", d.corpus):
                tallies[key].add(float(d.nll), d.tokens, d.n_bytes)

    for ids, corpus, n_bytes in docs:
        ws = list(windows(ids, eos_id, seq_len))
        doc = _Doc(len(ids), corpus, n_bytes, len(ws))
        pending.append(doc)
        for x, y, n in ws:
            rows.append((doc, x, y, n))
            if len(rows) == batch_size:
                _score_rows(nll_fn, params, rows, batch_size)
                rows = []
        tally_finished()
    if rows:
        _score_rows(nll_fn, params, rows, batch_size)
    tally_finished()
    return dict(tallies)


def _score_rows(nll_fn: Any, params: Any, rows: list[tuple[_Doc, np.ndarray, np.ndarray, int]],
                batch_size: int) -> None:
    """Add each row's summed NLL to its document."""
    pad = batch_size - len(rows)  # fixed shapes: one compiled function
    xs = np.stack([r[1] for r in rows] + [rows[0][1]] * pad)
    ys = np.stack([r[2] for r in rows] + [rows[0][2]] * pad)
    nll = np.asarray(nll_fn(params, xs, ys), dtype=np.float64)  # (B, T)
    for k, (doc, _, _, n) in enumerate(rows):
        doc.nll += nll[k, :n].sum()
        doc.left -= 1


def token_counts(chunks: Iterable[np.ndarray], vocab_size: int) -> np.ndarray:
    """How often each id below ``vocab_size`` occurs in the chunks of token ids (int64)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in chunks:
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def unigram_logp(counts: np.ndarray) -> np.ndarray:
    """The add-one-smoothed unigram model's log-probability of each id, from train ``counts``."""
    # Integer counts below 2**53 are exact in float64: the same values as summing per document.
    smoothed = (counts + 1).astype(np.float64)
    return np.log(smoothed / smoothed.sum())


def unigram(counts: np.ndarray, docs: Iterable[tuple[np.ndarray, str, int]],
            logp: np.ndarray | None = None) -> dict[str, Tally]:
    """The same tallies under an add-one-smoothed unigram model with train ``counts`` (``logp``: its
    table, given: rounded to float32 under the universal profile, marin.evaluate.universal_scoring)."""
    logp = unigram_logp(counts) if logp is None else logp
    tallies: dict[str, Tally] = defaultdict(Tally)
    for ids, corpus, n_bytes in docs:
        nll = float(-logp[ids].sum())
        for key in ("", corpus):
            tallies[key].add(nll, len(ids), n_bytes)
    return dict(tallies)

