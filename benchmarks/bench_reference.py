"""The reference stage's validation text, one window a forward pass (as it scored before issue 57) against
lm-eval's batching (:func:`marin.evaluate.reference_scoring.bits_per_byte`), side by side, on a model folder
and a validation split of a project (needs ``--group hf``):

    uv run python benchmarks/bench_reference.py --model refs/tiny --text data/curated/validation.parquet \
        [--rounds 2] [--threads 1,2] [--batch-size 32]

Each measurement is a fresh worker process (torch's thread count is fixed once it computes): lm-eval's ``hf``
model on the folder (CPU, float32), then the whole text scored, timed (wall and process CPU seconds) with its
forward passes counted. Rounds alternate the two ways. Prints one JSON line per measurement, then the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _one_by_one(lm: Any, validation: Path) -> tuple[float, int]:
    """The old scoring: each window of each document its own forward pass. (nats, passes)"""
    import pyarrow.parquet as pq
    import torch

    nats, passes, ctx, start = 0.0, 0, lm.max_length, lm.prefix_token_id
    with torch.no_grad():
        for text in pq.read_table(validation, columns=["text"]).column(0).to_pylist():
            seq = [start, *lm.tok_encode(text, add_special_tokens=False)]
            for j in range(0, len(seq) - 1, ctx):
                y = seq[j + 1: j + ctx + 1]
                logp = torch.log_softmax(lm.model(torch.tensor([seq[j: j + len(y)]])).logits[0].float(), dim=-1)
                nats -= float(logp[torch.arange(len(y)), torch.tensor(y)].double().sum())
                passes += 1
    return nats, passes


def _batched(lm: Any, validation: Path) -> tuple[float, int]:
    from marin.evaluate import reference_scoring as rs
    from marin.progress import meter

    cost = rs.Cost(lm.batch_size)
    rs.counted(lm, cost)
    with cost.measuring("validation", meter("bench", hide=True)) as m:
        tallies = rs.bits_per_byte(validation, lm, cost, m)
    return tallies[""].nll_nats, cost.passes["validation"]


def _worker(way: str, model: str, text: str, threads: int, batch_size: int) -> None:
    import os

    import torch

    torch.set_num_threads(threads)
    from lm_eval.models.huggingface import HFLM

    lm: Any = HFLM(pretrained=model, device="cpu", dtype="float32", batch_size=batch_size)
    t0, c0 = time.perf_counter(), os.times()
    nats, passes = (_batched if way == "batched" else _one_by_one)(lm, Path(text))
    c1 = os.times()
    print(json.dumps({"way": way, "threads": threads, "wall_s": round(time.perf_counter() - t0, 2),
                      "cpu_s": round(c1.user + c1.system - c0.user - c0.system, 2), "forward_passes": passes,
                      "nll_nats": nats}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        way, threads = a.worker.split(":")
        return _worker(way, a.model, a.text, int(threads), a.batch_size)
    rows: list[dict[str, Any]] = []
    for _ in range(a.rounds):
        for threads in (int(t) for t in a.threads.split(",")):
            for way in ("one_by_one", "batched"):
                p = subprocess.run([sys.executable, __file__, "--model", a.model, "--text", a.text, "--batch-size",
                                    str(a.batch_size), "--worker", f"{way}:{threads}"], capture_output=True,
                                   text=True, check=True, env={"MARIN_PROGRESS": "off", **_env()})
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    for threads in sorted({r["threads"] for r in rows}):
        got = {w: [r for r in rows if r["way"] == w and r["threads"] == threads] for w in ("one_by_one", "batched")}
        med = {w: (statistics.median(r["wall_s"] for r in rs), statistics.median(r["cpu_s"] for r in rs))
               for w, rs in got.items()}
        print(f"{threads} thread(s): one window a pass {med['one_by_one'][0]:.1f} s wall, {med['one_by_one'][1]:.1f} "
              f"s CPU ({got['one_by_one'][0]['forward_passes']} passes); batched {med['batched'][0]:.1f} s wall, "
              f"{med['batched'][1]:.1f} s CPU ({got['batched'][0]['forward_passes']} passes)")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MARIN_PROGRESS"}


if __name__ == "__main__":
    main()
