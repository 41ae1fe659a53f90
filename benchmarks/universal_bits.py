"""How far apart two machines' float64 universal steps are, in float32 ulps: the measurement behind tau
(marin.train.rounding_log.TAU; docs/determinism.md, "Universal bits").

    uv run python benchmarks/universal_bits.py --out x86.npz [--steps 6] [--size tiny|emulated|shipped]
    $(scripts/arm64-env.sh) benchmarks/universal_bits.py --out arm.npz       # minutes under qemu-aarch64
    uv run python benchmarks/universal_bits.py --compare x86.npz arm.npz

Runs the universal profile's step (marin.train.universal.make_step's jitted function) from a fresh init on
random tokens, each step from the float32 state the previous one rounded to (nearest even, as a recorder
does), and saves every step's float64 results (state and metrics). ``--compare`` prints, per step, the
largest |a - b| over all values in units of each value's float32 ulp, how many values differ at all in
float64, whether the rounded float32 states are equal, and the largest distance from a midpoint among
values whose rounding the two machines would take differently.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {  # (vocab, d_model, layers, heads, kv heads, d_ff, seq, batch)
    "tiny": (400, 32, 2, 2, 1, 64, 32, 8),  # tests/conftest.py TINY: the cross-architecture tests' model
    "emulated": (400, 64, 1, 2, 1, 128, 32, 4),  # tests/test_portable.py's emulated model
    "shipped": (4096, 128, 4, 4, 2, 384, 128, 2),  # params.yaml's model, the batch cut to 2 rows
}


def run(size: str, steps: int) -> dict[str, np.ndarray]:
    from marin.config import RuntimeParams
    from marin.train import runtime

    runtime.configure(RuntimeParams(xla_cpu_threads=2, devices=1, param_sharding="replicated",
                                    determinism="universal"))
    import dataclasses

    import jax
    import jax.numpy as jnp

    from marin.config import TrainParams
    from marin.model import ModelConfig
    from marin.train import step, universal

    v, d, n, h, k, f, t, b = SIZES[size]
    cfg = ModelConfig(vocab_size=v, d_model=d, n_layers=n, n_heads=h, n_kv_heads=k, d_ff=f, max_seq_len=t)
    tp = TrainParams(steps=100, batch_size=b, lr=3e-3, schedule="cosine", warmup_steps=2, min_lr_ratio=0.1,
                     wsd_decay_fraction=0.2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0,
                     log_every=1, checkpoint_every=100)
    mesh = runtime.make_mesh(RuntimeParams(xla_cpu_threads=2, devices=1, param_sharding="replicated"))
    opt = step.make_optimizer(tp)
    _, abstract = step.abstract_state(cfg, opt)
    shardings = step.state_shardings(abstract, mesh, "replicated")
    wide, _ = step.abstract_state(dataclasses.replace(cfg, dtype="float64"), opt)
    us = universal.make_step(wide, tp, shardings, mesh, universal.RoundingLog(2.0**-18), keep=True)
    state = jax.jit(lambda: step.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)[1],
                    out_shardings=shardings)()
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    t0 = time.time()
    for i in range(steps):
        toks = rng.integers(0, v, (b, t + 1)).astype(np.int32)
        state, metrics = us(state, {"inputs": jnp.asarray(toks[:, :-1]), "targets": jnp.asarray(toks[:, 1:])})
        assert us.kept is not None
        for prefix, tree in zip(("grad", "", "scale "), us.kept, strict=True):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                if leaf.dtype == np.float64:
                    out[f"{i + 1} {prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf).reshape(-1)
        for name, m in metrics.items():
            out[f"{i + 1} metric.{name}"] = np.asarray(m, np.float64).reshape(-1)
        print(f"step {i + 1}: loss {float(metrics['loss']).hex()} ({time.time() - t0:.1f} s)", flush=True)
    return out


def compare(a: Path, b: Path) -> None:
    """Per step: the largest |a - b| in float32 ulps of each value's scale (the gradient's: its tensor's
    largest value; the state's: the recorded error scales) and of each value's own ulp, the values the
    two would round differently, and the near values (the log's entries) at a few thresholds."""
    from marin.train import rounding

    x, y = np.load(a), np.load(b)
    steps = sorted({int(k.split(" ", 1)[0]) for k in x.files})
    worst, worst_own = 0.0, 0.0
    for s in steps:
        keys = [k for k in x.files if k.startswith(f"{s} ") and not k.startswith(f"{s} scale ")]
        most, own, differ, total, split = 0.0, 0.0, 0, 0, 0
        near = {e: 0 for e in (16, 18, 20)}
        for k in keys:
            p, q = x[k], y[k]
            scale = x[k.replace(f"{s} ", f"{s} scale ", 1)] if f"{s} scale {k.split(' ', 1)[1]}" in x.files else None
            if scale is None and "grad" not in k and "metric" not in k:
                continue  # integer leaves have no scale
            unit = np.ldexp(1.0, rounding.ulp_exponent(np.abs(scale) if scale is not None else np.abs(p).max()))
            unit = np.maximum(unit, np.ldexp(1.0, rounding.ulp_exponent(p)))
            total += p.size
            most = max(most, float((np.abs(p - q) / unit).max()))
            own = max(own, float((np.abs(p - q) / np.ldexp(1.0, rounding.ulp_exponent(p))).max()))
            differ += int(np.count_nonzero(p != q))
            split += int((rounding.round_f32(p).view(np.uint32) != rounding.round_f32(q).view(np.uint32)).sum())
            for e in near:
                near[e] += int(rounding.near_scaled(p, 2.0**-e, scale).sum())
        worst, worst_own = max(worst, most), max(worst_own, own)
        print(f"step {s}: {total} values, {differ} differ in float64; largest |a-b| {most:.3g} float32 ulp of its "
              f"scale (2^{np.log2(most) if most else float('-inf'):.1f}), {own:.3g} of its own; rounded "
              f"differently: {split}; near at tau 2^-16/18/20: {near[16]}/{near[18]}/{near[20]}")
    print(f"largest |a-b| over {len(steps)} steps: 2^{np.log2(worst) if worst else float('-inf'):.1f} float32 ulp of "
          f"the scale, 2^{np.log2(worst_own) if worst_own else float('-inf'):.1f} of the value's own")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--compare", nargs=2, type=Path)
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        np.savez(args.out, allow_pickle=False, **run(args.size, args.steps))
