"""Training throughput and memory: marin's jitted JAX step against idiomatic PyTorch, eager and
under ``torch.compile``, and against the matmul peak of this machine, measured side by side at
two sizes: the default model of params.yaml and a larger one (d_model 256, 8 layers, d_ff 768,
seq 256, same heads, vocabulary and batch).

    uv run python benchmarks/bench_train.py [--rounds 3] [--steps 6] [--sizes default,large]
        [--variants jax,jax-native,eager,compile] [--torch-python PATH]
    uv run python benchmarks/bench_train.py profiles    # portable vs native determinism profile
    uv run python benchmarks/bench_topology.py          # 1 process x 4 devices vs 2 x 2

Each measurement is a fresh worker process (so that its peak RSS, from ``getrusage``, is its
own): it builds the model and optimizer, compiles (the time is printed, and kept out of the
tokens/s), warms up for two steps and times ``--steps`` steps. ``jax`` is marin's step under
``runtime.determinism`` of params.yaml (portable), ``jax-native`` the same under the native
profile; ``eager`` and ``compile`` are benchmarks/torch_reference.py (SDPA with causal masking
and GQA, fused AdamW, the step under ``torch.compile`` or not), run by ``--torch-python`` (by
default this venv's, where the ``hf`` group installs torch). Rounds alternate the variants at each
size so machine noise hits all alike: read the per-round ratios and their medians. All use
``runtime.xla_cpu_threads`` threads. MFU counts model FLOPs per token as PaLM, which defined it
(Chowdhery et al. 2022, appendix B): 6N plus attention 12·L·T·d (the score and the value products,
with no discount for the causal mask), N counting the tied output projection; the column "Kaplan"
counts attention's 6·L·T·d of Kaplan et al. 2020 (what this benchmark printed before issue 29's
second session). Both are against the best f32 1024³ matmul
of the same rounds. Also printed: seconds per checkpoint (save, wait for commit, restore, digest:
what the train loop does) and the evaluate function's tokens/s. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from marin import allocator  # noqa: E402

VARIANTS = ("jax", "jax-native", "eager", "compile")


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
        attention = 6 * self.cfg.n_layers * self.t * self.cfg.d_model  # Kaplan's: one of the two products
        self.flops_per_token = 6 * self.n_params + 2 * attention  # PaLM's (the MFU column)
        self.flops_per_token_kaplan = 6 * self.n_params + attention

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


def torch_config(spec: Any, threads: int) -> dict[str, Any]:
    cfg, tp, b = spec
    return {"vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "d_ff": cfg.d_ff, "seq_len": cfg.max_seq_len,
            "rope_theta": cfg.rope_theta, "batch_size": b, "threads": threads,
            "lr": tp.lr, "betas": [tp.beta1, tp.beta2], "eps": tp.eps, "weight_decay": tp.weight_decay,
            "grad_clip": tp.grad_clip}


def _jax_worker(size: str, determinism: str, steps: int) -> None:
    """One JAX measurement in this process: tokens/s, compile s, peak RSS (a JSON line)."""
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    runtime.configure(dataclasses.replace(p.runtime, determinism=determinism, devices=1, processes=1))
    bench = JaxBench(sizes(p)[size])
    bench.run(2)
    tps = bench.run(steps)
    print(json.dumps({"tokens_per_s": tps, "compile_s": bench.compile_s,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "flops_per_token": bench.flops_per_token, "flops_per_token_kaplan": bench.flops_per_token_kaplan,
                      "n_params": int(bench.n_params)}), flush=True)


def worker_env(fast_allocator: bool = True, **extra: str) -> dict[str, str]:
    """A worker's environment: with the allocator a train stage restarts itself with (marin.allocator)."""
    env = {**os.environ, **extra}
    if fast_allocator:
        env.update(allocator.fast_env(env)[1])
    return env


def measure(variant: str, size: str, spec: Any, steps: int, threads: int, torch_python: str,
            fast_allocator: bool = True) -> dict[str, Any]:
    """One measurement of ``variant`` at ``size`` in a fresh process."""
    if variant.startswith("jax"):
        cmd = [sys.executable, __file__, "jax-worker", size, "native" if variant == "jax-native" else "portable",
               str(steps)]
    else:
        cmd = [torch_python, str(ROOT / "benchmarks/torch_reference.py"), json.dumps(torch_config(spec, threads)),
               variant, str(steps)]
    env = worker_env(fast_allocator, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, env=env)
    if out.returncode:
        raise SystemExit(f"the {variant} worker at size {size} exited {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def report(name: str, spec: Any, runs: dict[str, list[dict[str, Any]]], peak: float) -> None:
    """The table of one size: median tokens/s, MFU, compile s and peak RSS per variant, then the
    per-round ratios of JAX to each other variant."""
    cfg, _, b = spec
    jx = runs.get("jax") or runs.get("jax-native") or []
    fpt = jx[0]["flops_per_token"] if jx else float("nan")
    kaplan = jx[0]["flops_per_token_kaplan"] if jx else float("nan")
    print(f"\n[{name}] d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads}/{cfg.n_kv_heads} heads, "
          f"d_ff {cfg.d_ff}, vocab {cfg.vocab_size}, batch {b} x {cfg.max_seq_len}"
          + (f": {jx[0]['n_params']:,} params, {fpt / 1e6:.1f} MFLOP/token (Kaplan {kaplan / 1e6:.1f})" if jx else ""))
    print(f"  {'variant':11s} {'tokens/s':>9s} {'MFU':>6s} {'Kaplan':>6s} {'compile s':>9s} {'peak RSS':>9s}   "
          "rounds (tokens/s)")
    for v, rs in runs.items():
        tps = _median(rs, "tokens_per_s")
        print(f"  {v:11s} {tps:9.0f} {tps * fpt / peak:6.1%} {tps * kaplan / peak:6.1%} "
              f"{_median(rs, 'compile_s'):9.1f} "
              f"{max(r['peak_rss_bytes'] for r in rs) / 2**30:7.2f} GB   "
              + ", ".join(f"{r['tokens_per_s']:.0f}" for r in rs))
    for v, rs in runs.items():
        if v == "jax" or not jx:
            continue
        ratios = [j["tokens_per_s"] / r["tokens_per_s"] for j, r in zip(jx, rs, strict=True)]
        print(f"  jax / {v:10s} median {statistics.median(ratios):.2f}, per round "
              + ", ".join(f"{x:.2f}" for x in ratios))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sizes", default="default,large")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--torch-python", default=sys.executable, help="a python that has torch")
    ap.add_argument("--extras", action="store_true", help="also checkpoint seconds and evaluate tokens/s")
    ap.add_argument("--system-allocator", action="store_true", help="workers with glibc's default malloc")
    a = ap.parse_args()
    p = load_params()
    threads = p.runtime.xla_cpu_threads
    specs = {k: v for k, v in sizes(p).items() if k in a.sizes.split(",")}
    variants = [v for v in VARIANTS if v in a.variants.split(",")]
    runs = {name: {v: [] for v in variants} for name in specs}
    peaks: list[float] = []
    print(f"load average before starting: {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(a.rounds):
        peaks.append(matmul_peak())
        for name, spec in specs.items():
            for v in variants:
                runs[name][v].append(measure(v, name, spec, a.steps, threads, a.torch_python,
                                              not a.system_allocator))
            print(f"round {r + 1} {name:8s} " + "  ".join(f"{v} {rs[-1]['tokens_per_s']:.0f}"
                                                         for v, rs in runs[name].items()), flush=True)
    peak = max(peaks)
    print(f"\n{threads} threads, medians of {a.rounds} alternating rounds of {a.steps} steps, a fresh process per "
          f"measurement; matmul peak (f32 1024^3, best of the rounds) {peak / 1e9:.1f} GFLOP/s")
    for name, spec in specs.items():
        report(name, spec, runs[name], peak)
        if a.extras:
            jb = JaxBench(spec)
            print(f"  checkpoint: {jb.checkpoint_s():.2f} s each   evaluate: {jb.eval_tokens_s(a.steps):.0f} tokens/s")


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
                       stdout=subprocess.PIPE, env=worker_env())
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
    allocator.tune_jemalloc()  # a worker: as a restarted train stage does (marin.allocator)
    if sys.argv[1:2] == ["profiles"]:
        sys.exit(profiles(sys.argv[2:]))
    if sys.argv[1:2] == ["profile-worker"]:
        sys.exit(_profile_worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    if sys.argv[1:2] == ["jax-worker"]:
        sys.exit(_jax_worker(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(main())
