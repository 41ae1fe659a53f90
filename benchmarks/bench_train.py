"""Training throughput: marin's jitted JAX step against the matmul peak of this machine
and against a plain PyTorch reference of the same model, measured side by side.

    uv run python benchmarks/bench_train.py [--rounds 3] [--steps 15] [--torch-python python3]

The PyTorch reference (benchmarks/torch_reference.py) runs in a worker process using
an interpreter that has torch (install the CPU build with `python3 -m pip install
torch==2.13.0`); rounds alternate JAX / PyTorch so machine noise hits both alike. Model
FLOPs per token follow Kaplan et al. 2020 (6N plus attention 6·L·T·d, counting the
tied output projection). Prints ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--torch-python", default="python3")
    a = ap.parse_args()

    from marin import config

    p = config.load(ROOT / "params.yaml")
    os.environ["NPROC"] = str(p.runtime.xla_cpu_threads)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin.train import loop, step

    cfg = loop.model_config(p, p.tokenize.vocab_size)
    b, t = p.train.batch_size, cfg.max_seq_len
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    opt = step.make_optimizer(p.train)
    graphdef, state = step.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)
    shard = step.state_shardings(state, mesh, "replicated")
    state = jax.device_put(state, shard)
    train_step = step.make_train_step(graphdef, opt, shard, mesh)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (b, t + 1), dtype=np.int32)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
    state, _ = train_step(state, batch)
    jax.block_until_ready(state)

    n_params = sum(v.size for v in jax.tree.leaves(state.params))
    flops_per_token = 6 * n_params + 6 * cfg.n_layers * t * cfg.d_model

    n = 1024
    mm = jax.jit(lambda u, v: u @ v)
    u = jnp.ones((n, n), jnp.float32)
    jax.block_until_ready(mm(u, u))

    def peak() -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            out = mm(u, u)
        jax.block_until_ready(out)
        return 20 * 2 * n**3 / (time.perf_counter() - t0)

    def jax_round() -> float:
        nonlocal state
        t0 = time.perf_counter()
        for _ in range(a.steps):
            state, _ = train_step(state, batch)
        jax.block_until_ready(state)
        return a.steps * b * t / (time.perf_counter() - t0)

    torch_cfg = {"vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                 "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "d_ff": cfg.d_ff, "seq_len": t,
                 "rope_theta": cfg.rope_theta, "batch_size": b, "threads": p.runtime.xla_cpu_threads}
    worker = None
    try:
        worker = subprocess.Popen([a.torch_python, str(ROOT / "benchmarks/torch_reference.py")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        worker.stdin.write(f"CONFIG {json.dumps(torch_cfg)}\n")
        worker.stdin.flush()
        if worker.stdout.readline().strip() != "OK":
            worker = None
    except OSError:
        worker = None
    if worker is None:
        print(f"(no PyTorch reference: {a.torch_python} cannot import torch)")

    jx, th, pk = [], [], []
    for _ in range(a.rounds):
        pk.append(peak())
        jx.append(jax_round())
        if worker is not None:
            worker.stdin.write(f"RUN {a.steps}\n")
            worker.stdin.flush()
            th.append(float(worker.stdout.readline()))
    if worker is not None:
        worker.stdin.close()
        worker.wait()

    best_jax, best_peak = max(jx), max(pk)
    print(f"model: {n_params:,} params, batch {b} x {t} tokens, {flops_per_token / 1e6:.1f} MFLOP/token, "
          f"{p.runtime.xla_cpu_threads} threads, best of {a.rounds} alternating rounds")
    print(f"matmul peak (f32 {n}x{n}):   {best_peak / 1e9:8.1f} GFLOP/s")
    mfu = best_jax * flops_per_token / best_peak
    print(f"marin JAX train step:        {best_jax:8.0f} tokens/s   "
          f"{best_jax * flops_per_token / 1e9:6.1f} GFLOP/s   MFU vs matmul peak {mfu:.1%}")
    if th:
        best_torch = max(th)
        print(f"PyTorch eager reference:     {best_torch:8.0f} tokens/s   "
              f"{best_torch * flops_per_token / 1e9:6.1f} GFLOP/s   MFU vs matmul peak "
              f"{best_torch * flops_per_token / best_peak:.1%}")
        print(f"ratio JAX / PyTorch tokens/s: {best_jax / best_torch:.2f}")


# -- process topology (issue 13): 1 process x 4 devices against 2 processes x 2 devices ---------
#
#     uv run python benchmarks/bench_train.py topology [--rounds 2] [--steps 10]
#
# Each measurement is a fresh set of worker processes (jax.distributed over gloo on 127.0.0.1
# for 2 x 2), the params.yaml model with the params.yaml global batch on a 4-device mesh, each
# process at runtime.xla_cpu_threads threads. Rounds alternate 1x4 / 2x2; tokens/s counts the
# global batch over the timed steps (after 2 warm-up steps), CPU s are the workers' user+system
# time (compilation included).

def _topology_worker(processes: int, devices: int, pid: int, port: int, steps: int) -> None:
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    rt = dataclasses.replace(p.runtime, devices=devices, processes=processes)
    runtime.configure(rt)
    import jax
    import numpy as np

    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", processes, pid)
    from marin.train import loop, step

    cfg = loop.model_config(p, p.tokenize.vocab_size)
    b, t = p.train.batch_size, cfg.max_seq_len
    mesh = runtime.make_mesh(rt)
    opt = step.make_optimizer(p.train)
    graphdef, abstract = step.abstract_state(cfg, opt)
    shard = step.state_shardings(abstract, mesh, rt.param_sharding)
    keys = jax.random.key(0), jax.random.key(1)
    state = jax.jit(lambda: step.init_state(cfg, *keys, opt)[1], out_shardings=shard)()
    train_step = step.make_train_step(graphdef, opt, shard, mesh)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t + 1), dtype=np.int32)  # same on every process
    sharding = step.batch_sharding(mesh)
    batch = {k: jax.make_array_from_callback((b, t), sharding, lambda i, v=v: v[i])
             for k, v in (("inputs", x[:, :-1]), ("targets", x[:, 1:]))}
    for _ in range(2):
        state, m = train_step(state, batch)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = train_step(state, batch)
    jax.block_until_ready(m)
    if pid == 0:
        print(json.dumps({"tokens_per_s": steps * b * t / (time.perf_counter() - t0)}), flush=True)
    if processes > 1:
        jax.distributed.shutdown()


def _topology_round(processes: int, devices: int, steps: int) -> tuple[float, float]:
    """(tokens/s, CPU seconds of all workers) of one fresh set of workers."""
    import resource
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [subprocess.Popen([sys.executable, __file__, "topology-worker", str(processes), str(devices), str(i),
                               str(port), str(steps)], stdout=subprocess.PIPE, text=True)
             for i in range(processes)]
    outs = [pr.communicate()[0] for pr in procs]
    if any(pr.returncode for pr in procs):
        raise SystemExit(f"a {processes}x{devices} worker failed: {[pr.returncode for pr in procs]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(outs[0].strip().splitlines()[-1])["tokens_per_s"], cpu


def topology(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_train.py topology")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {"1x4": [], "2x2": []}
    for _ in range(a.rounds):
        results["1x4"].append(_topology_round(1, 4, a.steps))
        results["2x2"].append(_topology_round(2, 2, a.steps))
    print(f"process topology, 4 CPU devices, params.yaml model and batch, best of {a.rounds} alternating rounds "
          f"of {a.steps} steps (machine shared: compare the ratio, not the absolute numbers)")
    for name, rs in results.items():
        print(f"  {name}: {max(r[0] for r in rs):8.0f} tokens/s   CPU s per round (all workers, with compile): "
              + ", ".join(f"{r[1]:.1f}" for r in rs))
    best = {k: max(r[0] for r in v) for k, v in results.items()}
    print(f"ratio 2x2 / 1x4 tokens/s: {best['2x2'] / best['1x4']:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["topology"]:
        sys.exit(topology(sys.argv[2:]))
    if sys.argv[1:2] == ["topology-worker"]:
        sys.exit(_topology_worker(*(int(v) for v in sys.argv[2:7])))
    sys.exit(main())
