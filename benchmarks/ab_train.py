"""A/B of model/step versions in one process, one step of each in turn (for a shared
machine: per-step CPU and wall times, min / p25 / median per version).

    git show REV:marin/model/transformer.py > /tmp/t_old.py; git show REV:marin/train/step.py > /tmp/s_old.py
    uv run python benchmarks/ab_train.py default|large /tmp/t_old.py:/tmp/s_old.py,marin/model/transformer.py:marin/train/step.py ROUNDS STEPS

Each version is a transformer.py:step.py pair of files, loaded as its own modules.
"""
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["NPROC"]="2"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import jax
import numpy as np

from marin import config
from marin.train import loop


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
p = config.load(ROOT / "params.yaml")
cfg0 = loop.model_config(p, p.tokenize.vocab_size)
size = sys.argv[1]; variants = sys.argv[2].split(","); rounds=int(sys.argv[3]); steps=int(sys.argv[4])
if size == "large": cfg0 = dataclasses.replace(cfg0, d_model=256, n_layers=8, d_ff=768, max_seq_len=256)
b, t = p.train.batch_size, cfg0.max_seq_len
mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
x = np.random.default_rng(0).integers(0, cfg0.vocab_size, (b, t+1), dtype=np.int32)
batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
runs = {}
for v in variants:
    tpath, spath = v.split(":")
    tm = load("tm_"+v, tpath)
    sys.modules["marin.model"].Transformer = tm.Transformer; sys.modules["marin.model"].ModelConfig = tm.ModelConfig
    sm = load("sm_"+v, spath)
    cfg = tm.ModelConfig(**dataclasses.asdict(cfg0))
    opt = sm.make_optimizer(p.train)
    gd, st = sm.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)
    sh = sm.state_shardings(st, mesh, "replicated"); st = jax.device_put(st, sh)
    ts = sm.make_train_step(gd, opt, sh, mesh)
    t0=time.perf_counter(); c = ts.lower(st, batch).compile(); ct=time.perf_counter()-t0
    st, m = ts(st, batch); jax.block_until_ready(st)
    print(v, "compile", round(ct,1), "loss", float(m["loss"]), flush=True)
    runs[v] = [ts, st, []]
for r in range(rounds):
    for v in variants:
        ts, st, res = runs[v]
        for _ in range(steps):
            t0=time.perf_counter(); c0=time.process_time()
            st, m = ts(st, batch); jax.block_until_ready(st)
            res.append((time.perf_counter()-t0, time.process_time()-c0))
        runs[v][1] = st
    if r % 5 == 4: print("round", r, flush=True)
for v in variants:
    w = sorted(x[0] for x in runs[v][2]); c = sorted(x[1] for x in runs[v][2])
    print(f"{v.split('/')[-2] if 0 else v}: wall min {w[0]*1e3:.0f} ms p25 {w[len(w)//4]*1e3:.0f} median {statistics.median(w)*1e3:.0f}  cpu min {c[0]*1e3:.0f} median {statistics.median(c)*1e3:.0f}  -> {b*t/w[0]:.0f} tok/s at min", flush=True)
