"""The universal determinism profile against the portable one, side by side (issue 56): step time, peak RSS,
and the rounding log's entries and bytes per step, at the default size of params.yaml and the large one
(bench_train.py's: d_model 256, 8 layers, d_ff 768, sequence 256).

    uv run python benchmarks/bench_universal.py [--rounds 2] [--steps 4] [--sizes default,large]

Each measurement is a fresh worker process (XLA's flags and x64 are fixed when a backend starts):
runtime.configure with the profile, the stage's own step (marin.train.step.make_train_step, or
marin.train.universal.make_step writing its log to a temporary file) on random batches of the
params' batch size, 2 warm-up steps, then ``--steps`` timed ones. Rounds alternate the profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _worker(profile: str, size: str, steps: int) -> None:
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    runtime.configure(dataclasses.replace(p.runtime, determinism=profile))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from bench_train import sizes

    from marin.train import step, universal

    cfg, tp, b = sizes(p)[size]
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    opt = step.make_optimizer(tp)
    _, abstract = step.abstract_state(cfg, opt)
    shardings = step.state_shardings(abstract, mesh, "replicated")
    state = jax.jit(lambda: step.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)[1],
                    out_shardings=shardings)()
    log = None
    with tempfile.TemporaryDirectory() as d:
        if profile == "universal":
            wide, _ = step.abstract_state(dataclasses.replace(cfg, dtype="float64"), opt)
            log = universal.RoundingLog(universal.rounding_log.tau())
            log.open(Path(d) / "rounding.jsonl", 0)
            train_step = universal.make_step(wide, tp, shardings, mesh, log)
        else:
            graphdef, _ = step.abstract_state(cfg, opt)
            train_step = step.make_train_step(graphdef, opt, shardings, mesh)
        rng = np.random.default_rng(0)

        def batch() -> dict[str, jax.Array]:
            x = rng.integers(0, cfg.vocab_size, (b, cfg.max_seq_len + 1), dtype=np.int32)
            return {"inputs": jnp.asarray(x[:, :-1]), "targets": jnp.asarray(x[:, 1:])}

        t0 = time.perf_counter()
        for i in range(2):
            state, metrics = train_step(state, batch())
            if log is not None:
                log.end_step(i + 1, durable=False)
        jax.block_until_ready((state, metrics))
        warm = time.perf_counter() - t0
        before = (log.total(), (Path(d) / "rounding.jsonl").stat().st_size) if log is not None else (0, 0)
        t0 = time.perf_counter()
        for i in range(2, 2 + steps):
            state, metrics = train_step(state, batch())
            if log is not None:
                log.end_step(i + 1, durable=False)
        jax.block_until_ready((state, metrics))
        step_s = (time.perf_counter() - t0) / steps
        after = (log.total(), (Path(d) / "rounding.jsonl").stat().st_size) if log is not None else (0, 0)
        if log is not None:
            log.close()
    print(json.dumps({"step_s": step_s, "warmup_s": warm, "peak_rss_gb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 2**20, "entries_per_step": (after[0] - before[0]) / steps,
        "log_bytes_per_step": (after[1] - before[1]) / steps}), flush=True)


def _round(profile: str, size: str, steps: int) -> dict[str, float]:
    from bench_train import worker_env

    p = subprocess.run([sys.executable, __file__, "worker", profile, size, str(steps)], text=True,
                       stdout=subprocess.PIPE, env=worker_env())
    if p.returncode:
        raise SystemExit(f"the {profile} worker at size {size} exited {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_universal.py")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sizes", default="default,large")
    a = ap.parse_args(argv)
    print(f"universal against portable: {a.rounds} alternating rounds of {a.steps} timed steps per size")
    for size in a.sizes.split(","):
        runs: dict[str, list[dict[str, float]]] = {"portable": [], "universal": []}
        for _ in range(a.rounds):
            for prof in runs:
                runs[prof].append(_round(prof, size, a.steps))
        print(f"[{size}]")
        for prof, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"  {prof:9s} step {med['step_s']:.3f} s (rounds " + ", ".join(f"{r['step_s']:.3f}" for r in rs)
                  + f"), peak RSS {med['peak_rss_gb']:.2f} GB, log {med['entries_per_step']:.0f} entries "
                  f"{med['log_bytes_per_step'] / 1024:.1f} KiB per step, compile+2 steps {med['warmup_s']:.1f} s")
        ratios = [u["step_s"] / p["step_s"] for u, p in zip(runs["universal"], runs["portable"], strict=True)]
        print(f"  universal / portable step time: median {statistics.median(ratios):.2f}, per round "
              + ", ".join(f"{r:.2f}" for r in ratios), flush=True)


if __name__ == "__main__":
    from marin import allocator

    allocator.tune_jemalloc()
    if sys.argv[1:2] == ["worker"]:
        sys.exit(_worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(main(sys.argv[1:]))
