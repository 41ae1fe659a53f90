"""Stage trace_index's suffix-array index (marin/evaluate/trace_index.py): build time and peak RSS at 1x
and 16x the corpus, and the latency of ``marin trace``'s search (median and p99 over 100 queries of 100
tokens), with the growth exponents (log(16x / 1x) / log 16: 1 is linear, 0 flat). The build sorts each
shard, then merges the shards' suffix arrays into one (marin/evaluate/sa_merge.py); its time and peak RSS
include the merge, and a query is one binary search over the merged array.

    uv run python benchmarks/bench_trace.py [--scales 1,16] [--tokens 2500000] [--shard-tokens 4194304]

1x is ``--tokens`` token ids (default 2.5 M, about the shipped corpus of 10 MB under its 4,096-token
vocabulary), in documents of 500 tokens drawn from a Zipf distribution over 4,096 ids, each document
also repeating a 50-token passage of an earlier one (repeats are what makes suffix sorting take more
rounds); 16x is 16 times as many documents. Each scale runs in its own process, which generates the
documents as it indexes them (never holding the corpus); the build's peak RSS (ru_maxrss) is taken
right after the build (generation and build), the process's again after the queries (the document table
held for lookups, and the pages of the memory-mapped shards the searches touched, which the kernel can
drop). Half the queries are 100 tokens copied from indexed documents, half random ids.

With ``--query-kb 1,10,100`` it measures instead ``marin trace``'s search against the length of the text
(issue 55: the old search held an m x m matrix of the text's suffixes):

    uv run python benchmarks/bench_trace.py --query-kb 1,10,100 [--checkout DIR]

The training text is synthetic prose (Zipf-drawn pseudo-words in sentences and lines): 300 documents of
6 KB and two of the longest query's length and more, 2.2 MB in all, encoded by a 4,096-token BPE trained on
it (``marin.data.tokenize.train_tokenizer``) and indexed by ``trace_index.build``. Two texts of each
length: ``verbatim``, one passage of a long training document, and ``mosaic``, passages of 500 bytes from
random documents joined by newlines (a span every 500 bytes). Each text is traced in its own process, as
``marin trace`` traces it (``tracing.trace_ids``, spans of 8 tokens, their documents and snippets), after
the index is opened and the text encoded; the process's peak RSS resets there (``/proc/self/clear_refs``),
so "added" is what the trace adds to the RSS before it. Then it traces again under ``tracemalloc`` for the
peak of its heap allocations (numpy's included). Growth exponents are least-squares slopes of log(value)
against log(KB). ``--checkout DIR`` runs the children on another checkout's ``marin`` (a before/after).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

DOC_TOKENS, VOCAB, REPEAT = 500, 4096, 50


def documents(n_docs: int, keep: list[np.ndarray]) -> Iterator[np.ndarray]:
    """The synthetic corpus, the same every time; every (n_docs // 50)th document kept for queries."""
    rng = np.random.default_rng(1)
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1))
    cdf /= cdf[-1]
    previous = np.zeros(DOC_TOKENS, dtype=np.int64)
    for i in range(n_docs):
        doc = np.minimum(np.searchsorted(cdf, rng.random(DOC_TOKENS)), VOCAB - 1).astype(np.int64)
        at = int(rng.integers(0, DOC_TOKENS - REPEAT))
        doc[at:at + REPEAT] = previous[at:at + REPEAT]
        previous = doc
        if i % max(1, n_docs // 50) == 0:
            keep.append(doc)
        yield doc


def child(n_docs: int, shard_tokens: int) -> dict[str, float]:
    from marin.evaluate import trace_index as ti

    keep: list[np.ndarray] = []
    t = time.perf_counter()
    for _ in documents(n_docs, []):  # generation alone, to subtract
        pass
    gen_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        docs = (ti.Doc(f"d{i}", "synthetic", "bench", "CC0-1.0", x) for i, x in enumerate(documents(n_docs, keep)))
        built = ti.build(docs, Path(d), shard_tokens)
        build_s = time.perf_counter() - t - gen_s
        build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the peak so far: generation and build
        index = ti.Index(Path(d))
        rng = np.random.default_rng(2)
        queries = [keep[i % len(keep)][200:300] if i % 2 == 0 else rng.integers(0, VOCAB, 100) for i in range(100)]
        index.spans(queries[0], 8)  # first touch of the maps
        times, found = [], 0
        for q in queries:
            t = time.perf_counter()
            spans = index.spans(q, 8)
            times.append(time.perf_counter() - t)
            found += any(s.length == 100 for s in spans)
        index_mb = sum(p.stat().st_size for p in Path(d).iterdir()) / 1e6
    return {"docs": n_docs, "tokens": built["tokens"], "shards": built["shards"], "index_mb": index_mb,
            "build_s": build_s, "query_median_ms": 1e3 * float(np.median(times)),
            "query_p99_ms": 1e3 * float(np.percentile(times, 99)), "copied_found": found, "build_rss_mb": build_rss,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="1,16")
    ap.add_argument("--tokens", type=int, default=2_500_000)
    ap.add_argument("--shard-tokens", type=int, default=1 << 22)
    ap.add_argument("--child", type=int)
    ap.add_argument("--query-kb", help="measure instead one trace of texts of these lengths, in KB: 1,10,100")
    ap.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose marin the children import (default this one)")
    ap.add_argument("--query-child", nargs=2, metavar=("FOLDER", "TEXT"))
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child, a.shard_tokens)))
        return
    if a.query_child:
        print(json.dumps(query_child(Path(a.query_child[0]), Path(a.query_child[1]))))
        return
    if a.query_kb:
        query_main([int(x) for x in a.query_kb.split(",")], a.checkout, Path(__file__))
        return
    base = a.tokens // DOC_TOKENS
    rows = {}
    print("| scale | tokens | shards | index | build | build peak RSS | query median | query p99 | copied found | "
          "peak RSS after queries |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in (int(x) for x in a.scales.split(",")):
        env = {**os.environ, "PYTHONPATH": str(a.checkout)}  # this checkout's marin
        out = subprocess.run([sys.executable, __file__, "--child", str(base * s), "--shard-tokens",
                              str(a.shard_tokens)], capture_output=True, text=True, check=True, env=env)
        rows[s] = r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {s}x | {r['tokens'] / 1e6:.1f} M | {r['shards']} | {r['index_mb']:.0f} MB | {r['build_s']:.1f} s | "
              f"{r['build_rss_mb']:.0f} MB | {r['query_median_ms']:.1f} ms | {r['query_p99_ms']:.1f} ms | "
              f"{r['copied_found']} of 50 | {r['peak_rss_mb']:.0f} MB |", flush=True)
    lo, hi = min(rows), max(rows)
    if hi > lo:
        k = math.log(hi / lo)
        print("growth exponents (log(ratio) / log(scale ratio)): " + ", ".join(
            f"{key} {math.log(rows[hi][key] / rows[lo][key]) / k:.2f}"
            for key in ("build_s", "build_rss_mb", "query_median_ms", "query_p99_ms", "peak_rss_mb")))


# -- one trace against the length of its text ------------------------------------------------------

PIECE, SMALL_DOCS, SMALL_BYTES = 500, 300, 6000  # mosaic passages; the short documents


def prose(rng: np.random.Generator, words: list[str], cdf: np.ndarray, n_bytes: int) -> str:
    """Pseudo-word sentences, a line every 12 words, at least ``n_bytes`` long (ASCII)."""
    out, size = [], 0
    while size < n_bytes:
        picks = np.minimum(np.searchsorted(cdf, rng.random(12)), len(words) - 1)
        line = " ".join(words[i] for i in picks).capitalize() + "."
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def query_setup(folder: Path, kbs: list[int]) -> list[tuple[str, int, Path]]:
    """The training text, its tokenizer and index in ``folder``; each text to trace, as (kind, KB, file)."""
    from marin.config import TokenizeParams
    from marin.data import tokenize as tk
    from marin.evaluate import trace_index as ti

    rng = np.random.default_rng(5)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = sorted({"".join(rng.choice(letters, int(rng.integers(2, 10)))) for _ in range(6000)})
    cdf = np.cumsum(1.0 / np.arange(1, len(words) + 1))
    cdf /= cdf[-1]
    long_bytes = max(kbs) * 1000 + 20_000
    docs = [prose(rng, words, cdf, long_bytes) for _ in range(2)] + [prose(rng, words, cdf, SMALL_BYTES)
                                                                       for _ in range(SMALL_DOCS)]
    tok = tk.train_tokenizer(docs, TokenizeParams(vocab_size=4096, min_frequency=2, shard_max_tokens=1 << 20))
    tok.save(str(folder / "tokenizer.json"))
    ti.build((ti.Doc(f"d{i}", "prose", "bench", "CC0-1.0", np.array(tok.encode(d, add_special_tokens=False).ids))
              for i, d in enumerate(docs)), folder / "index", 1 << 20)
    texts = []
    for kb in kbs:
        n = kb * 1000
        start = docs[0].index(" ", 10_000) + 1
        verbatim = docs[0][start:start + n]
        pieces, size = [], 0
        while size < n:
            d = docs[int(rng.integers(0, len(docs)))]
            at = d.index(" ", int(rng.integers(0, len(d) - 2 * PIECE))) + 1
            pieces.append(d[at:at + min(PIECE, n - size)])
            size += len(pieces[-1]) + 1
        for kind, text in (("verbatim", verbatim), ("mosaic", "\n".join(pieces)[:n])):
            path = folder / f"{kind}-{kb}.txt"
            path.write_text(text.rstrip(), encoding="utf-8")
            texts.append((kind, kb, path))
    return texts


def _status(key: str) -> float:
    """A field of /proc/self/status in MB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def query_child(folder: Path, path: Path) -> dict[str, float]:
    import tracemalloc

    from marin.data import tokenize as tk
    from marin.evaluate import tracing
    from marin.evaluate.trace_index import Index

    index, tok = Index(folder / "index"), tk.load(folder / "tokenizer.json")
    ids = tracing.encode(tok, path.read_text(encoding="utf-8"))
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS (VmHWM) starts again from the RSS now
    t, cpu = time.perf_counter(), time.process_time()
    got = tracing.trace_ids(index, tok, ids, 8)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    peak = _status("VmHWM")
    tracemalloc.start()
    tracing.trace_ids(index, tok, ids, 8)
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    return {"tokens": len(ids), "spans": len(got["spans"]), "longest": got["longest"], "wall_s": wall, "cpu_s": cpu,
            "before_mb": before, "peak_mb": peak, "added_mb": peak - before, "traced_mb": traced,
            "process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of log(ys) against log(xs)."""
    return float(np.polyfit(np.log(xs), np.log(np.maximum(ys, 1e-9)), 1)[0])


def query_main(kbs: list[int], checkout: Path, script: Path) -> None:
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        texts = query_setup(Path(d), kbs)
        print("| text | KB | tokens | spans | longest | wall | CPU | RSS before | peak RSS | added by the trace | "
              "traced allocations |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for kind, kb, path in texts:
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            out = subprocess.run([sys.executable, str(script), "--query-child", d, str(path)], capture_output=True,
                                 text=True, env=env)
            if out.returncode != 0:
                print(f"| {kind} | {kb} | failed: exit {out.returncode}, {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.setdefault(kind, []).append({"kb": kb, **r})
            print(f"| {kind} | {kb} | {r['tokens']:,} | {r['spans']} | {r['longest']:,} | {r['wall_s']:.2f} s | "
                  f"{r['cpu_s']:.2f} s | {r['before_mb']:.0f} MB | {r['peak_mb']:.0f} MB | {r['added_mb']:.1f} MB | "
                  f"{r['traced_mb']:.1f} MB |", flush=True)
    for kind, rs in rows.items():
        if len(rs) > 1:
            kb = [r["kb"] for r in rs]
            print(f"{kind}: growth exponents (log-log slope over {', '.join(map(str, kb))} KB): " + ", ".join(
                f"{key} {slope(kb, [r[key] for r in rs]):.2f}" for key in ("added_mb", "traced_mb", "cpu_s")))


if __name__ == "__main__":
    main()
