"""Evaluation: bits per byte and perplexity on the validation split (whole and per
corpus), a unigram baseline on the same tokens, and greedy samples.

Each validation document is scored on its own: the sequence ``[EOS] + tokens`` is cut
into windows of ``seq_len`` predictions, so every document token is predicted exactly
once, from at most ``seq_len`` tokens of its own document. Bits per byte divide the
summed negative log-likelihood (in bits) by the document's UTF-8 bytes, so the number
does not depend on the tokenizer (Gao et al. 2020, "The Pile", section 3.2).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def windows(ids: np.ndarray, eos_id: int, seq_len: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(inputs, targets, n_valid) windows covering every token of one document once."""
    seq = np.concatenate([[eos_id], ids]).astype(np.int32)
    for j in range(0, len(seq) - 1, seq_len):
        x, y = seq[j : j + seq_len], seq[j + 1 : j + seq_len + 1]
        n = len(y)
        pad = seq_len - n
        yield np.pad(x[:n], (0, pad), constant_values=eos_id), np.pad(y, (0, pad), constant_values=eos_id), n


def score(nll_fn: Any, params: Any, docs: list[tuple[np.ndarray, str, int]], eos_id: int, seq_len: int,
          batch_size: int) -> dict[str, Tally]:
    """Tallies per corpus and overall (key ``""``) for (token ids, corpus, bytes) docs."""
    rows: list[tuple[int, np.ndarray, np.ndarray, int]] = []
    for d, (ids, _, _) in enumerate(docs):
        rows.extend((d, x, y, n) for x, y, n in windows(ids, eos_id, seq_len))
    per_doc = np.zeros(len(docs), dtype=np.float64)
    for b in range(0, len(rows), batch_size):
        chunk = rows[b : b + batch_size]
        pad = batch_size - len(chunk)  # fixed shapes: one compiled function
        xs = np.stack([r[1] for r in chunk] + [chunk[0][1]] * pad)
        ys = np.stack([r[2] for r in chunk] + [chunk[0][2]] * pad)
        nll = np.asarray(nll_fn(params, xs, ys), dtype=np.float64)  # (B, T)
        for k, (d, _, _, n) in enumerate(chunk):
            per_doc[d] += nll[k, :n].sum()
    tallies: dict[str, Tally] = defaultdict(Tally)
    for d, (ids, corpus, n_bytes) in enumerate(docs):
        for key in ("", corpus):
            tallies[key].add(float(per_doc[d]), len(ids), n_bytes)
    return dict(tallies)


def unigram(train_ids: list[np.ndarray], vocab_size: int, docs: list[tuple[np.ndarray, str, int]]) -> dict[str, Tally]:
    """The same tallies under an add-one-smoothed unigram model of the train tokens."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for ids in train_ids:
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    logp = np.log(counts / counts.sum())
    tallies: dict[str, Tally] = defaultdict(Tally)
    for ids, corpus, n_bytes in docs:
        nll = float(-logp[ids].sum())
        for key in ("", corpus):
            tallies[key].add(nll, len(ids), n_bytes)
    return dict(tallies)


def greedy(logits_fn: Any, params: Any, prompt_ids: list[int], eos_id: int, seq_len: int, n: int) -> list[int]:
    """Greedy continuation; a fixed (1, seq_len) buffer so one compiled function serves
    every length (causal attention: padding on the right changes nothing before it)."""
    ids = [eos_id, *prompt_ids][-seq_len:]
    out: list[int] = []
    for _ in range(n):
        window = (ids + out)[-seq_len:]
        buf = np.full((1, seq_len), eos_id, dtype=np.int32)
        buf[0, : len(window)] = window
        logits = np.asarray(logits_fn(params, buf))  # (1, T, V)
        out.append(int(logits[0, len(window) - 1].argmax()))
    return out
