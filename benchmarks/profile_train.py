"""Where a train step's time goes: a jax.profiler trace of a few steps, each XLA thunk
mapped to its HLO instruction (compiled.as_text()) and grouped by what it does.

    uv run python benchmarks/profile_train.py [--size default|large] [--steps 3]

Groups: matmuls (YNNPACK/dot fusions) of the forward pass, of the backward pass, the
loss/softmax, attention softmax, layout copies (transposes), the optimizer update (ops
outside jvp/transpose), other elementwise. Times are per step, wall time of the thunk
as the profiler saw it; on a shared machine compare shares, not absolute numbers.

With more than one thread the per-thunk times mislead: XLA runs the weight-gradient
matmuls (Eigen ``dot`` thunks) asynchronously, so the trace shows a 0.1 ms launch for each
and their work lands inside whatever YNNPACK thunk runs beside them. ``--threads 1``
(one XLA thread, no overlap) gives each thunk's own CPU cost.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def instructions(hlo: str) -> dict[str, tuple[str, str, str]]:
    """name -> (shape, op kind, op_name metadata) for each instruction of the entry."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) (\w[\w\-]*)\((.*)$", hlo, re.M):
        meta = re.search(r'op_name="([^"]*)"', m.group(4))
        out[m.group(1)] = (m.group(2), m.group(3), meta.group(1) if meta else "")
    return out


def group(name: str, info: tuple[str, str, str] | None) -> str:
    _, kind, op = info if info else ("", "", "")
    bwd = "transpose(" in op
    core = "jvp(" in op or bwd
    if not core:
        return "optimizer / other outside the model"
    if name.startswith(("ynn_fusion", "dot", "onednn")) or op.endswith("dot_general"):
        return "matmul backward" if bwd else "matmul forward"
    if name.startswith(("copy", "transpose")) or kind in ("copy", "transpose"):
        return "layout copies (transpose)"
    return "elementwise/reduce backward" if bwd else "elementwise/reduce forward"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="default", choices=("default", "large"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, help="XLA CPU threads (default: runtime.xla_cpu_threads)")
    a = ap.parse_args()
    import bench_train

    bench = bench_train.JaxBench(bench_train.sizes(bench_train.load_params(a.threads))[a.size])
    import jax

    hlo = instructions(bench.compiled_text())
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            bench.run(a.steps)
        with gzip.open(next(Path(d).rglob("*.trace.json.gz"))) as f:
            trace = json.load(f)
    total, per_op = collections.Counter(), collections.Counter()
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"] in hlo:
            per_op[e["name"]] += e["dur"] / a.steps / 1e3
            total[group(e["name"], hlo[e["name"]])] += e["dur"] / a.steps / 1e3
    s = sum(total.values())
    print(f"{a.size}: {s:.1f} ms of thunks per step")
    for k, v in total.most_common():
        print(f"  {v:9.1f} ms  {v / s:6.1%}  {k}")
    print(f"top {a.top} thunks:")
    for k, v in per_op.most_common(a.top):
        shape, _, op = hlo[k]
        print(f"  {v:9.1f} ms  {k:32s} {shape[:34]:34s} {op[-70:]}")


if __name__ == "__main__":
    main()
