"""Training tokens/s with live metrics to MLflow against without them, in one process.

    uv run python benchmarks/bench_live_metrics.py [--rounds 4] [--window 100] [--uri URI]

One jitted train step of the params.yaml model on a fixed random batch, in windows of
``--window`` steps that alternate between live metrics off and on (so machine noise hits
both alike). Every ``--log-every`` steps the loop does what the train stage does: a host
sync for the metrics and a ledger ``metric`` record; in "on" windows a
``marin.tracking.live.Live`` thread runs as in the stage (started at the window's start,
closed at its end, so its start-up is counted every window: pessimistic) and sends a batch
every ``--live-every`` records to MLflow (default: a fresh SQLite store, the embedded
default; ``--uri`` for a server). Prints tokens/s and CPU seconds per mode and the ratio;
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--live-every", type=int, default=2)
    ap.add_argument("--uri")
    a = ap.parse_args()

    from marin import config

    p = config.load(ROOT / "params.yaml")
    os.environ["NPROC"] = str(p.runtime.xla_cpu_threads)
    import jax
    import numpy as np
    from mlflow import MlflowClient

    from marin.ledger import Run, exact
    from marin.tracking.live import Live
    from marin.train import loop, step

    cfg = loop.model_config(p, p.tokenize.vocab_size)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    opt = step.make_optimizer(p.train)
    graphdef, state = step.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)
    shard = step.state_shardings(state, mesh, "replicated")
    state = jax.device_put(state, shard)
    train_step = step.make_train_step(graphdef, opt, shard, mesh)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (p.train.batch_size, cfg.max_seq_len + 1), dtype=np.int32)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
    state, _ = train_step(state, batch)
    jax.block_until_ready(state)
    tokens = p.train.batch_size * cfg.max_seq_len

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ledger" / "runs").mkdir(parents=True)
        uri = a.uri or f"sqlite:///{root / 'mlflow.db'}"
        os.environ.update(MLFLOW_TRACKING_URI=uri, MARIN_MLFLOW="on", MARIN_MLFLOW_LIVE_EVERY=str(a.live_every))
        MlflowClient(uri).search_experiments()  # the store exists, as in a project that synced before
        run = Run.start(root, "train", params={}, inputs=[])
        rate: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        done, sent = 0, 0
        for _ in range(a.rounds):
            for mode in ("off", "on"):
                os.environ["MARIN_MLFLOW_LIVE"] = mode
                t, c = time.perf_counter(), time.process_time()
                live = Live.start(root, run.run_id)
                for _ in range(a.window):
                    state, metrics = train_step(state, batch)
                    done += 1
                    if done % a.log_every == 0:  # what the stage does at a log step
                        m = jax.device_get(metrics)
                        run.record("metric", {"step": done, "values": {k: exact(m[k]) for k in
                                                                       ("loss", "grad_norm", "accuracy")}})
                        live.step()
                jax.block_until_ready(state)
                live.close()
                sent += live.sent
                rate[mode].append(a.window * tokens / (time.perf_counter() - t))
                cpu[mode].append(time.process_time() - c)
        run.finish()
    off, on = statistics.median(rate["off"]), statistics.median(rate["on"])
    print(f"{a.rounds} rounds of {a.window}-step windows alternating off/on; metrics every {a.log_every} steps, "
          f"live batches every {a.live_every} records; {sent} metric values reached MLflow ({uri.split(':')[0]})")
    for mode in ("off", "on"):
        print(f"live metrics {mode:3}: {statistics.median(rate[mode]):10,.0f} tokens/s (median; "
              f"{', '.join(f'{r:,.0f}' for r in rate[mode])}), CPU {statistics.median(cpu[mode]):.2f} s per window")
    print(f"ratio on/off: {on / off:.4f} ({(1 - on / off) * 100:+.2f}% slower with live metrics)")


if __name__ == "__main__":
    main()
