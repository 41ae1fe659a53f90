"""Stage decontaminate's n-gram index (marin/evaluate/ngrams.py): build time, query time and peak RSS
at 1x and 16x the corpus.

    uv run python benchmarks/bench_decontaminate.py [--scales 1,16] [--mb 10]

1x is ``--mb`` MB of synthetic text (default 10 MB, about the shipped corpus: Shakespeare, Milton and
the KJV), in 500-word documents drawn from a Zipf vocabulary of 50,000 words; 16x is 16 times as many
documents. Each scale runs in its own process, which generates the documents as it indexes them
(never holding the corpus), then checks 2,000 items of 30 words (a tenth copied from the corpus);
its peak RSS (ru_maxrss) covers generation, build and query. Generation alone is timed in a first
pass and subtracted. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

DOC_WORDS, VOCAB = 500, 50_000
BYTES_PER_WORD = 7.5  # measured: the vocabulary below, joined by spaces


def vocab() -> np.ndarray:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(VOCAB)], dtype=object)


def documents(n_docs: int, words: np.ndarray) -> Iterator[str]:
    rng = np.random.default_rng(1)
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1))
    cdf /= cdf[-1]
    for _ in range(n_docs):
        yield " ".join(words[np.minimum(np.searchsorted(cdf, rng.random(DOC_WORDS)), VOCAB - 1)])


def child(n_docs: int) -> dict[str, float]:
    from marin.evaluate import ngrams

    words = vocab()
    copied = []
    t = time.perf_counter()
    for i, doc in enumerate(documents(n_docs, words)):  # generation alone, keeping 200 passages to look up
        if i % max(1, n_docs // 200) == 0 and len(copied) < 200:
            copied.append(doc.split()[100:130])
    gen_s = time.perf_counter() - t
    rng = np.random.default_rng(2)
    items = [list(words[rng.integers(0, VOCAB, 30)]) for _ in range(1800)]
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        built = ngrams.build(documents(n_docs, words), 13, Path(d))
        build_s = time.perf_counter() - t - gen_s  # less the generation it waited for
        t = time.perf_counter()
        dirty, _ = ngrams.contaminated(Path(d), [*items, *copied], 13)
        query_s = time.perf_counter() - t
        index_mb = sum(p.stat().st_size for p in Path(d).iterdir()) / 1e6
    return {"docs": n_docs, "ngrams": built["ngrams"], "runs": built["runs"], "index_mb": index_mb,
            "generate_s": gen_s, "build_s": build_s, "query_s": query_s, "dirty": sum(dirty),
            "copied": len(copied), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="1,16")
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--child", type=int)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child)))
        return
    base = int(a.mb * 1e6 / (DOC_WORDS * BYTES_PER_WORD))
    print("| scale | text | 13-grams | runs | index | build | query (2,000 items) | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for s in (int(x) for x in a.scales.split(",")):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's marin
        out = subprocess.run([sys.executable, __file__, "--child", str(base * s)], capture_output=True, text=True,
                             check=True, env=env)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {s}x | {r['docs'] * DOC_WORDS * BYTES_PER_WORD / 1e6:.0f} MB | {r['ngrams'] / 1e6:.1f} M | "
              f"{r['runs']} | {r['index_mb']:.0f} MB | {r['build_s']:.1f} s | {r['query_s']:.2f} s "
              f"({r['dirty']} of {r['copied']} copied found) | {r['peak_rss_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
