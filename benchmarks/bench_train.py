"""Training throughput: marin's jitted JAX step against the matmul peak of this machine
and against a plain PyTorch eager reference of the same model, measured side by side,
at two sizes: the default model of params.yaml and a larger one (d_model 256, 8 layers,
d_ff 768, seq 256, same heads, vocabulary and batch).

    uv run python benchmarks/bench_train.py [--rounds 3] [--steps 10] [--sizes default,large]
        [--torch-cmd "uv run --no-project --with torch==2.13.0 python"]
    uv run python benchmarks/bench_train.py profiles    # portable vs native determinism profile

The PyTorch reference (benchmarks/torch_reference.py) runs in one worker process per size,
started with ``--torch-cmd`` (by default an ephemeral uv environment with torch from
PyPI: the first start downloads it, ~2 min; later starts reuse uv's cache). Rounds
alternate JAX / PyTorch at each size so machine noise hits both alike: on a shared machine
read the per-round ratios (and their median), not the absolute tokens/s. Both use
``runtime.xla_cpu_threads`` threads. Model FLOPs per token follow Kaplan et al. 2020 (6N
plus attention 6·L·T·d, counting the tied output projection); MFU is against the best
f32 1024³ matmul of the same rounds. Also printed: compile time of the step, seconds per
checkpoint (save, wait for commit, restore, digest: what the train loop does) and the
evaluate function's tokens/s. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TORCH_CMD = "uv run --no-project --python 3.11 --with torch==2.13.0 python"


def load_params(threads: int | None = None) -> Any:
    """params.yaml, with XLA's thread count (``runtime.xla_cpu_threads`` unless ``threads``), the
    determinism profile's XLA flags and the allocator set as the train stage sets them (one device);
    call before jax starts."""
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    runtime.configure(dataclasses.replace(p.runtime, xla_cpu_threads=threads or p.runtime.xla_cpu_threads,
                                          devices=1, processes=1))
    return p


def sizes(p: Any) -> dict[str, Any]:
    """name -> (ModelConfig, TrainParams, batch size)."""
    from marin.train import loop

    cfg = loop.model_config(p, p.tokenize.vocab_size)
    large = dataclasses.replace(cfg, d_model=256, n_layers=8, d_ff=768, max_seq_len=256)
    return {"default": (cfg, p.train, p.train.batch_size), "large": (large, p.train, p.train.batch_size)}


class JaxBench:
    """marin's own step (marin.train.step) on a fixed random batch."""

    def __init__(self, spec: Any):
        import jax
        import numpy as np

        from marin.train import step

        self.cfg, tp, self.b = spec
        self.t = self.cfg.max_seq_len
        mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        self.opt = step.make_optimizer(tp)
        self.graphdef, abstract = step.abstract_state(self.cfg, self.opt)
        self.shardings = step.state_shardings(abstract, mesh, "replicated")
        self.abstract = abstract
        keys = jax.random.key(0), jax.random.key(1)
        self.state = jax.jit(lambda: step.init_state(self.cfg, *keys, self.opt)[1],
                             out_shardings=self.shardings)()
        self.train_step = step.make_train_step(self.graphdef, self.opt, self.shardings, mesh)
        x = np.random.default_rng(0).integers(0, self.cfg.vocab_size, (self.b, self.t + 1), dtype=np.int32)
        self.batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
        t0 = time.perf_counter()
        self.compiled = self.train_step.lower(self.state, self.batch).compile()
        self.compile_s = time.perf_counter() - t0
        self.run(1)
        self.n_params = sum(v.size for v in jax.tree.leaves(self.state.params))
        self.flops_per_token = 6 * self.n_params + 6 * self.cfg.n_layers * self.t * self.cfg.d_model

    def compiled_text(self) -> str:
        return self.compiled.as_text()

    def run(self, steps: int) -> float:
        """tokens/s over ``steps`` steps."""
        import jax

        t0 = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.train_step(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))
        return steps * self.b * self.t / (time.perf_counter() - t0)

    def checkpoint_s(self, n: int = 2) -> float:
        """Seconds per checkpoint as the train loop takes one: save, commit, restore, digest."""
        from marin.train import checkpoint, weights

        with tempfile.TemporaryDirectory() as d:
            ckpts = checkpoint.Checkpoints(Path(d) / "ckpt")
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                ckpts.save(i, self.state, {"step": i})
                restored, _ = ckpts.restore(i, self.abstract, self.shardings)
                checkpoint.state_digest(restored), weights.params_digest(restored.params)
            ckpts.close()
            return (time.perf_counter() - t0) / n

    def eval_tokens_s(self, steps: int) -> float:
        """tokens/s of evaluate's jitted per-token NLL (marin.train.step.eval_nll_fn)."""
        import jax

        from marin.train import step

        nll = step.eval_nll_fn(self.graphdef)
        x, y = self.batch["inputs"], self.batch["targets"]
        jax.block_until_ready(nll(self.state.params, x, y))
        t0 = time.perf_counter()
        for _ in range(steps):
            out = nll(self.state.params, x, y)
        jax.block_until_ready(out)
        return steps * self.b * self.t / (time.perf_counter() - t0)


class TorchWorker:
    """benchmarks/torch_reference.py in its own process (torch lives outside marin's venv)."""

    def __init__(self, cmd: str, spec: Any, threads: int):
        cfg, tp, b = spec
        conf = {"vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "d_ff": cfg.d_ff, "seq_len": cfg.max_seq_len,
                "rope_theta": cfg.rope_theta, "batch_size": b, "threads": threads,
                "lr": tp.lr, "betas": [tp.beta1, tp.beta2], "eps": tp.eps, "weight_decay": tp.weight_decay,
                "grad_clip": tp.grad_clip}
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([*shlex.split(cmd), str(ROOT / "benchmarks/torch_reference.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ask(f"CONFIG {json.dumps(conf)}", "OK")

    def ask(self, line: str, expect: str | None = None) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline().strip()
        if expect is not None and out != expect:
            raise OSError(f"torch worker answered {out!r}")
        return out

    def run(self, steps: int) -> float:
        return float(self.ask(f"RUN {steps}"))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def matmul_peak(n: int = 1024, reps: int = 20) -> float:
    import jax
    import jax.numpy as jnp

    mm = jax.jit(lambda u, v: u @ v)
    u = jnp.ones((n, n), jnp.float32)
    jax.block_until_ready(mm(u, u))
    t0 = time.perf_counter()
    for _ in range(reps):
        out = mm(u, u)
    jax.block_until_ready(out)
    return reps * 2 * n**3 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sizes", default="default,large")
    ap.add_argument("--torch-cmd", default=TORCH_CMD, help="command line of a python that has torch ('' = none)")
    a = ap.parse_args()
    p = load_params()
    threads = p.runtime.xla_cpu_threads
    specs = {k: v for k, v in sizes(p).items() if k in a.sizes.split(",")}
    jaxb, workers = {}, {}
    for name, spec in specs.items():
        jaxb[name] = JaxBench(spec)
        if a.torch_cmd:
            try:
                workers[name] = TorchWorker(a.torch_cmd, spec, threads)
            except OSError as e:
                print(f"(no PyTorch reference for {name}: {e})")

    peaks: list[float] = []
    jx: dict[str, list[float]] = {k: [] for k in specs}
    th: dict[str, list[float]] = {k: [] for k in specs}
    for r in range(a.rounds):
        peaks.append(matmul_peak())
        for name in specs:
            jx[name].append(jaxb[name].run(a.steps))
            if name in workers:
                th[name].append(workers[name].run(a.steps))
            ratio = f"  ratio {jx[name][-1] / th[name][-1]:.2f}" if th[name] else ""
            print(f"round {r + 1} {name:8s} jax {jx[name][-1]:8.0f} tok/s"
                  + (f"  torch {th[name][-1]:8.0f} tok/s" if th[name] else "") + ratio, flush=True)
    for w in workers.values():
        w.close()

    peak = max(peaks)
    print(f"\n{threads} threads, best of {a.rounds} alternating rounds of {a.steps} steps (machine may be shared: "
          "per-round ratios are the comparison)")
    print(f"matmul peak (f32 1024^3): {peak / 1e9:.1f} GFLOP/s")
    for name, jb in jaxb.items():
        cfg = jb.cfg
        print(f"\n[{name}] d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads}/{cfg.n_kv_heads} heads, "
              f"d_ff {cfg.d_ff}, vocab {cfg.vocab_size}, batch {jb.b} x {jb.t}: {jb.n_params:,} params, "
              f"{jb.flops_per_token / 1e6:.1f} MFLOP/token")
        best = max(jx[name])
        print(f"  marin JAX train step:    {best:8.0f} tokens/s  {best * jb.flops_per_token / 1e9:6.1f} GFLOP/s  "
              f"MFU {best * jb.flops_per_token / peak:.1%}")
        if th[name]:
            bt = max(th[name])
            ratios = [j / t for j, t in zip(jx[name], th[name], strict=False)]
            print(f"  PyTorch eager reference: {bt:8.0f} tokens/s  {bt * jb.flops_per_token / 1e9:6.1f} GFLOP/s  "
                  f"MFU {bt * jb.flops_per_token / peak:.1%}")
            print(f"  JAX / PyTorch: best {best / bt:.2f}, per round {', '.join(f'{x:.2f}' for x in ratios)} "
                  f"(median {statistics.median(ratios):.2f})")
        print(f"  compile: {jb.compile_s:.1f} s   checkpoint: {jb.checkpoint_s():.2f} s each   "
              f"evaluate: {jb.eval_tokens_s(a.steps):.0f} tokens/s")


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


# -- determinism profiles (issue 23): portable against native, side by side ----------------------
#
#     uv run python benchmarks/bench_train.py profiles [--rounds 4] [--steps 6] [--sizes default,large]
#
# XLA's flags are fixed when a process starts its backend, so each measurement is a fresh worker
# process (runtime.configure with runtime.determinism set; one at a time: two large-size workers
# keeping their freed memory exceed 24 GB); it compiles, warms up for 2 steps, then times the steps.
# Rounds alternate portable / native at each size; the per-round ratios are the comparison.

def _profile_worker(profile: str, size: str, steps: int) -> None:
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    runtime.configure(dataclasses.replace(p.runtime, determinism=profile))
    bench = JaxBench(sizes(p)[size])
    bench.run(2)
    print(json.dumps({"tokens_per_s": bench.run(steps), "compile_s": bench.compile_s}), flush=True)


def _profile_round(profile: str, size: str, steps: int) -> dict[str, float]:
    p = subprocess.run([sys.executable, __file__, "profile-worker", profile, size, str(steps)], text=True,
                       stdout=subprocess.PIPE)
    if p.returncode:
        raise SystemExit(f"the {profile} worker at size {size} exited {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def profiles(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_train.py profiles")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sizes", default="default,large")
    a = ap.parse_args(argv)
    print(f"determinism profiles: training tokens/s, {a.rounds} alternating rounds of {a.steps} steps per size")
    for size in a.sizes.split(","):
        runs: dict[str, list[dict[str, float]]] = {"portable": [], "native": []}
        for _ in range(a.rounds):
            for prof in runs:
                runs[prof].append(_profile_round(prof, size, a.steps))
        tps = {prof: [r["tokens_per_s"] for r in rs] for prof, rs in runs.items()}
        ratios = [x / y for x, y in zip(tps["portable"], tps["native"], strict=True)]
        print(f"[{size}]")
        for prof, xs in tps.items():
            print(f"  {prof:8s} median {statistics.median(xs):8.0f} tokens/s  rounds "
                  + ", ".join(f"{x:.0f}" for x in xs) + f"  compile {runs[prof][0]['compile_s']:.1f} s")
        print(f"  portable / native: median {statistics.median(ratios):.3f}, per round "
              + ", ".join(f"{r:.3f}" for r in ratios), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["profiles"]:
        sys.exit(profiles(sys.argv[2:]))
    if sys.argv[1:2] == ["profile-worker"]:
        sys.exit(_profile_worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    if sys.argv[1:2] == ["topology"]:
        sys.exit(topology(sys.argv[2:]))
    if sys.argv[1:2] == ["topology-worker"]:
        sys.exit(_topology_worker(*(int(v) for v in sys.argv[2:7])))
    sys.exit(main())
