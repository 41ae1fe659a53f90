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
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child, a.shard_tokens)))
        return
    base = a.tokens // DOC_TOKENS
    rows = {}
    print("| scale | tokens | shards | index | build | build peak RSS | query median | query p99 | copied found | "
          "peak RSS after queries |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in (int(x) for x in a.scales.split(",")):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's marin
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


if __name__ == "__main__":
    main()
