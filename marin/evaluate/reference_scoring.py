"""How the reference stage scores, and what it costs: lm-eval's ``hf`` model (``HFLM``) batched as lm-eval
batches, every forward pass counted, each part shown as a progress bar on stderr (:mod:`marin.progress`).

The validation text is scored as the evaluate stage scores ours (:func:`marin.data.documents.windows`): each
document after the tokenizer's BOS, else EOS, cut into disjoint windows of the model's context, each token
predicted once from at most that many tokens of its own document; each window is an lm-eval request (its first
token the context, the rest the continuation) and ``HFLM._loglikelihood_tokens`` scores the windows of several
documents at once, ``batch_size`` windows a forward pass. It scored one window a pass before (issue 57;
docs/performance.md). Not ``loglikelihood_rolling``: its last window of a document takes a full context of
earlier tokens (on the shipped validation text 0.017% fewer nats than evaluate's windows), and its
``tok_encode`` follows the tokenizer's ``add_bos_token`` (a Llama tokenizer would put a second BOS in).

The counts (requests, windows, forward passes) are the same on every run and go to the ledger and the
context file; the seconds are printed and the run's ``run.finished`` holds its wall and CPU time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin.evaluate.scoring import Tally

CHUNK_BATCHES = 8  # batches of windows per call: the bar moves every few seconds, a chunk's windows stay small


@dataclass
class Cost:
    """What a reference run did, by part (``harness``, ``validation``): forward passes, requests or
    windows scored, and seconds (printed only: a replay takes other seconds)."""

    batch_size: int
    passes: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    part: str = ""
    meter: Any = None

    @contextlib.contextmanager
    def measuring(self, part: str, meter: Any) -> Iterator[Any]:
        """Count the forward passes of ``part`` and time it; ``meter`` (a progress bar) is closed after."""
        self.part, self.meter, t0 = part, meter, time.perf_counter()
        self.passes.setdefault(part, 0)
        self.rows.setdefault(part, 0)
        try:
            with meter:
                yield meter
        finally:
            self.seconds[part] = time.perf_counter() - t0
            self.part, self.meter = "", None

    def values(self, samples: int, docs: int) -> dict[str, int]:
        """The counts an eval record ``cost`` holds: the same on every run of the same requests."""
        return {"batch_size": self.batch_size, "harness_samples": samples,
                "harness_requests": self.rows.get("harness", 0),
                "harness_forward_passes": self.passes.get("harness", 0), "validation_docs": docs,
                "validation_windows": self.rows.get("validation", 0),
                "validation_forward_passes": self.passes.get("validation", 0)}

    def line(self) -> str:
        """Seconds and forward passes of each part, for the terminal."""
        return "; ".join(f"{part} {self.seconds.get(part, 0):.1f} s, {self.passes.get(part, 0):,} forward passes "
                         f"({self.rows.get(part, 0):,} {'requests' if part == 'harness' else 'windows'})"
                         for part in self.passes)


def counted(lm: Any, cost: Cost) -> None:
    """Count every forward pass of ``lm`` (``HFLM._model_call``: each batch lm-eval runs) in ``cost``, and the
    harness's requests as they are scored, on its meter (lm-eval's own bars are silenced by the harness run)."""
    call, loglikelihood = lm._model_call, lm.loglikelihood

    def forward(*args: Any, **kwargs: Any) -> Any:
        cost.passes[cost.part] = cost.passes.get(cost.part, 0) + 1
        if cost.meter is not None and cost.part == "harness":
            cost.meter.update(min(len(args[0]), cost.meter.total - cost.meter.n) if cost.meter.total else 0)
        return call(*args, **kwargs)

    def requests(reqs: list[Any], disable_tqdm: bool = False) -> Any:
        cost.rows[cost.part] = cost.rows.get(cost.part, 0) + len(reqs)
        if cost.meter is not None:
            cost.meter.total = (cost.meter.total or 0) + len(reqs)
            cost.meter.refresh()
        out = loglikelihood(reqs, disable_tqdm=True)
        if cost.meter is not None:  # requests grouped by lm-eval's one-token cache take no row of their own
            cost.meter.update(cost.meter.total - cost.meter.n)
        return out

    lm._model_call, lm.loglikelihood = forward, requests


def bits_per_byte(validation: Path, lm: Any, cost: Cost, meter: Any) -> dict[str, Tally]:
    """Each validation document's negative log-likelihood (the module's docstring), tallied whole (key ``""``)
    and per corpus; ``meter`` advances by document."""
    import pyarrow.parquet as pq
    tallies: dict[str, Tally] = {}
    start, ctx = lm.prefix_token_id, lm.max_length
    docs: list[tuple[str, int, int, int]] = []  # corpus, tokens, bytes, windows: those not yet scored
    windows: list[tuple[None, list[int], list[int]]] = []  # lm-eval's requests: (key, context, continuation)

    def flush() -> None:
        scored = lm._loglikelihood_tokens(windows, disable_tqdm=True) if windows else []
        at = 0
        for corpus, tokens, n_bytes, n in docs:
            nll = -sum(float(ll) for ll, _ in scored[at:at + n])
            at += n
            for key in ("", corpus):
                tallies.setdefault(key, Tally()).add(nll, tokens, n_bytes)
        meter.update(len(docs))
        cost.rows["validation"] = cost.rows.get("validation", 0) + len(windows)
        docs.clear()
        windows.clear()

    for b in pq.ParquetFile(validation).iter_batches(batch_size=64, columns=["text", "corpus"]):
        for text, corpus in zip(b.column("text").to_pylist(), b.column("corpus").to_pylist(), strict=True):
            seq = [start, *lm.tok_encode(text, add_special_tokens=False)]
            mine = [(None, seq[j:j + 1], seq[j + 1:j + ctx + 1]) for j in range(0, len(seq) - 1, ctx)]
            docs.append((corpus, len(seq) - 1, len(text.encode("utf-8")), len(mine)))
            windows.extend(mine)
            if len(windows) >= CHUNK_BATCHES * cost.batch_size:
                flush()
    flush()
    return tallies
