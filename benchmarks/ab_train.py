"""A/B of model/step versions in one process, one step of each in turn (for a shared
machine: per-step CPU and wall times, min / p25 / median per version).

    git show REV:marin/model/transformer.py > /tmp/t_old.py
    git show REV:marin/train/step.py > /tmp/s_old.py
    uv run python benchmarks/ab_train.py default \\
        /tmp/t_old.py:/tmp/s_old.py marin/model/transformer.py:marin/train/step.py --rounds 10 --steps 3

Each version is a transformer.py:step.py pair of files, loaded as its own modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def prepare(variant: str, cfg0: Any, p: Any, mesh: Any, batch: dict) -> list[Any]:
    """The compiled train step of one version and its first state."""
    import jax

    tpath, spath = variant.split(":")
    tm = load("tm_" + variant, tpath)
    sys.modules["marin.model"].Transformer = tm.Transformer  # the step module builds this version's model
    sys.modules["marin.model"].ModelConfig = tm.ModelConfig
    sm = load("sm_" + variant, spath)
    cfg = tm.ModelConfig(**dataclasses.asdict(cfg0))
    opt = sm.make_optimizer(p.train)
    graphdef, state = sm.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)
    shardings = sm.state_shardings(state, mesh, "replicated")
    state = jax.device_put(state, shardings)
    step = sm.make_train_step(graphdef, opt, shardings, mesh)
    t0 = time.perf_counter()
    step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    state, metrics = step(state, batch)
    jax.block_until_ready(state)
    print(variant, "compile", round(compile_s, 1), "loss", float(metrics["loss"]), flush=True)
    return [step, state, []]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("size", choices=("default", "large"))
    ap.add_argument("variants", nargs="+", help="transformer.py:step.py pairs")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="steps of one version per round")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_train  # the thread count, allocator and the two sizes of bench_train.py

    p = bench_train.load_params()
    cfg0, _, b = bench_train.sizes(p)[args.size]
    t = cfg0.max_seq_len
    import jax
    import numpy as np

    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    x = np.random.default_rng(0).integers(0, cfg0.vocab_size, (b, t + 1), dtype=np.int32)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
    runs = {v: prepare(v, cfg0, p, mesh, batch) for v in args.variants}
    for r in range(args.rounds):
        for v in args.variants:
            step, state, times = runs[v]
            for _ in range(args.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                state, _ = step(state, batch)
                jax.block_until_ready(state)
                times.append((time.perf_counter() - t0, time.process_time() - c0))
            runs[v][1] = state
        if r % 5 == 4:
            print("round", r, flush=True)
    for v in args.variants:
        wall, cpu = sorted(x[0] for x in runs[v][2]), sorted(x[1] for x in runs[v][2])
        print(f"{v}: wall min {wall[0] * 1e3:.0f} ms p25 {wall[len(wall) // 4] * 1e3:.0f} "
              f"median {statistics.median(wall) * 1e3:.0f}  cpu min {cpu[0] * 1e3:.0f} "
              f"median {statistics.median(cpu) * 1e3:.0f}  -> {b * t / wall[0]:.0f} tok/s at min", flush=True)


if __name__ == "__main__":
    main()
