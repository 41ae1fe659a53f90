"""Process topology (issue 13): 1 process x 4 devices against 2 processes x 2 devices, on one host and
on two hosts (issue 58).

    uv run python benchmarks/bench_topology.py [--rounds 2] [--steps 10] [--hosts]

``--hosts`` (root) adds 2 x 2 across two namespaced hosts (tests/hosts.py: a veth link each, on a bridge),
process 0 on host A and process 1 on host B, and the bytes each step moves over host B's link:
(bytes of a 2N-step run - bytes of an N-step run) / N, from the link's kernel counters.

Each measurement is a fresh set of worker processes (jax.distributed over gloo on 127.0.0.1
for 2 x 2), the params.yaml model with the params.yaml global batch on a 4-device mesh, each
process at runtime.xla_cpu_threads threads and on the allocator a train stage uses. Rounds
alternate 1x4 / 2x2; tokens/s counts the global batch over the timed steps (after 2 warm-up
steps), CPU s are the workers' user+system time (compilation included). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_train import worker_env  # noqa: E402


def _topology_worker(processes: int, devices: int, pid: int, coordinator: str, steps: int) -> None:
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    rt = dataclasses.replace(p.runtime, devices=devices, processes=processes)
    runtime.configure(rt)
    import jax
    import numpy as np

    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, processes, pid)
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _topology_round(processes: int, devices: int, steps: int, hosts: Any = None) -> tuple[float, float, int]:
    """(tokens/s, CPU seconds of all workers, bytes over host B's link) of one fresh set of workers;
    ``hosts``: process i on the i-th namespaced host, else all on 127.0.0.1."""
    import resource

    coordinator = f"{hosts['a'].ip if hosts else '127.0.0.1'}:{_free_port()}"
    link = Path(f"/sys/class/net/{hosts['b'].veth}/statistics") if hosts else None
    moved = (lambda: sum(int((link / f).read_text()) for f in ("rx_bytes", "tx_bytes"))) if link else (lambda: 0)
    before, sent = resource.getrusage(resource.RUSAGE_CHILDREN), moved()
    procs = []
    for i in range(processes):
        argv = [sys.executable, __file__, "worker", str(processes), str(devices), str(i), coordinator, str(steps)]
        if hosts:
            argv = hosts["ab"[i]].argv(argv)
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=worker_env()))
    outs = [pr.communicate()[0] for pr in procs]
    if any(pr.returncode for pr in procs):
        raise SystemExit(f"a {processes}x{devices} worker failed: {[pr.returncode for pr in procs]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(outs[0].strip().splitlines()[-1])["tokens_per_s"], cpu, moved() - sent


def topology(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_topology.py")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--hosts", action="store_true", help="also 2 x 2 across two namespaced hosts (root)")
    a = ap.parse_args(argv)
    results: dict[str, list[tuple[float, float, int]]] = {"1x4": [], "2x2": []}
    stack = contextlib.ExitStack()
    hosts = None
    if a.hosts:
        from tests.hosts import Hosts

        hosts = stack.enter_context(Hosts(["a", "b"]))
        results["2x2, 2 hosts"] = []
    with stack:
        for _ in range(a.rounds):
            results["1x4"].append(_topology_round(1, 4, a.steps))
            results["2x2"].append(_topology_round(2, 2, a.steps))
            if hosts:
                results["2x2, 2 hosts"].append(_topology_round(2, 2, a.steps, hosts))
        per_step = (_topology_round(2, 2, 2 * a.steps, hosts)[2] - results["2x2, 2 hosts"][-1][2]) / a.steps \
            if hosts else None
    print(f"process topology, 4 CPU devices, params.yaml model and batch, best of {a.rounds} alternating rounds "
          f"of {a.steps} steps (machine shared: compare the ratio, not the absolute numbers)")
    for name, rs in results.items():
        print(f"  {name:13s}: {max(r[0] for r in rs):8.0f} tokens/s   CPU s per round (all workers, with compile): "
              + ", ".join(f"{r[1]:.1f}" for r in rs))
    best = {k: max(r[0] for r in v) for k, v in results.items()}
    print(f"ratio 2x2 / 1x4 tokens/s: {best['2x2'] / best['1x4']:.2f}")
    if per_step is not None:
        print(f"ratio 2x2 on 2 hosts / 2x2 on 1 host tokens/s: {best['2x2, 2 hosts'] / best['2x2']:.2f}; "
              f"bytes over host B's link per step: {per_step:,.0f} ({per_step / 2**20:.2f} MiB)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        n, d, i, coordinator, steps = sys.argv[2:7]
        sys.exit(_topology_worker(int(n), int(d), int(i), coordinator, int(steps)))
    sys.exit(topology(sys.argv[1:]))
