"""Training tokens/s with live metrics to MLflow against without them, side by side in one process.

    uv run python benchmarks/bench_live_metrics.py [--rounds 6] [--window 40] [--uri URI] [--modes off,on]

One jitted train step of the params.yaml model on a fixed random batch, in windows of
``--window`` steps. Each round runs one window per mode, side by side, the order rotating from
round to round (off/on, on/off, ...: machine noise, drift and any order effect hit every mode
alike); the ratio is taken per round, between neighbouring windows, and its median reported.
Every ``--log-every`` steps the loop does what the train stage does: a host sync for the metrics
and a ledger ``metric`` record. In "on" windows a ``marin.tracking.live.Live`` thread runs as in
the stage and sends a batch every ``--live-every`` records to MLflow (default: a fresh SQLite
store, the embedded default, whose writes run in this process; ``--uri`` for a server). Every
window is a fresh ledger run (and so a fresh MLflow run), as a stage is. The thread's start-up
(creating the MLflow run: once per stage) is done before the window's clock starts and reported
apart; the window includes closing it (the last batch).

Per window it measures wall time (tokens/s), the process's CPU seconds (every thread: XLA's pool,
the loop, the live thread) and the live thread's own CPU seconds. On a shared machine the CPU
seconds per step are the steadier measure: the live thread's CPU is what live metrics cost.
Asserts nothing.
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
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--window", type=int, default=40)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--live-every", type=int, default=2)
    ap.add_argument("--modes", default="off,on", help="comma-separated: off, on")
    ap.add_argument("--uri")
    a = ap.parse_args()
    modes = a.modes.split(",")

    from marin import config

    p = config.load(ROOT / "params.yaml")
    os.environ["NPROC"] = str(p.runtime.xla_cpu_threads)
    import jax
    import numpy as np
    from mlflow import MlflowClient

    from marin.ledger import Recipe, Run, exact
    from marin.tracking import live as live_mod
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
    for _ in range(3):  # compiled and warm
        state, _ = train_step(state, batch)
    jax.block_until_ready(state)
    tokens = p.train.batch_size * cfg.max_seq_len

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ledger" / "runs").mkdir(parents=True)
        uri = a.uri or f"sqlite:///{root / 'mlflow.db'}"
        os.environ.update(MLFLOW_TRACKING_URI=uri, MARIN_MLFLOW="on", MARIN_MLFLOW_LIVE_EVERY=str(a.live_every))
        MlflowClient(uri).search_experiments()  # the store exists, as in a project that synced before
        rows: list[dict[str, dict[str, float]]] = []
        done, sent, startup = 0, 0, []
        for r in range(a.rounds):
            row: dict[str, dict[str, float]] = {}
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # each mode first in turn
                os.environ["MARIN_MLFLOW_LIVE"] = "off" if mode == "off" else "on"
                run = Run.start(root, Recipe("train", {}))  # a fresh run file, as a stage's
                live = live_mod.Live.start(root, run.run_id)
                if mode != "off":
                    live.ready.wait(120)
                    assert live.failed is None, live.failed
                    startup.append(live.cpu_s)
                thread0 = live.cpu_s
                t, c = time.perf_counter(), time.process_time()
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
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                if live._thread.is_alive():  # close() waits 5 s at most: a starved thread finishes off the clock,
                    live._thread.join()  # its CPU still counted below, and nothing of it runs in the next window
                run.finish()
                sent += live.sent
                row[mode] = {"tok_s": a.window * tokens / wall, "cpu": cpu / a.window,
                             "thread": (live.cpu_s - thread0) / a.window}
            rows.append(row)
            print(f"round {r + 1}: " + "; ".join(
                f"{m} {v['tok_s']:9,.0f} tok/s, CPU {v['cpu'] * 1e3:6.1f} ms/step (live thread "
                f"{v['thread'] * 1e3:.2f})" for m, v in sorted(row.items(), key=lambda kv: modes.index(kv[0]))),
                  flush=True)
    report(a, modes, rows, sent, startup, uri)


def report(a: argparse.Namespace, modes: list[str], rows: list[dict], sent: int, startup: list[float],
           uri: str) -> None:
    def med(mode: str, key: str) -> float:
        return statistics.median(r[mode][key] for r in rows)

    print(f"\n{a.rounds} rounds of {a.window}-step windows ({'/'.join(modes)}, the order rotating); a metric "
          f"record every {a.log_every} steps, a live batch every {a.live_every} records; {sent} metric values "
          f"reached MLflow ({uri.split(':')[0]})")
    for mode in modes:
        print(f"  {mode:9} {med(mode, 'tok_s'):10,.0f} tokens/s (median), process CPU {med(mode, 'cpu') * 1e3:.1f} "
              f"ms/step, live thread {med(mode, 'thread') * 1e3:.2f} ms/step")
    if startup:
        print(f"  live start-up in its thread (creating the MLflow run; once per stage, before the clock here; "
              f"MLflow already imported): {statistics.median(startup):.3f} CPU s")
    for mode in modes[1:]:
        speed = statistics.median(r[mode]["tok_s"] / r[modes[0]]["tok_s"] for r in rows)
        cpu = statistics.median(r[mode]["cpu"] / r[modes[0]]["cpu"] for r in rows)
        share = med(mode, "thread") / med(modes[0], "cpu")
        per_record = med(mode, "thread") * a.log_every
        print(f"{mode} / {modes[0]}: tokens/s ratio {speed:.4f} ({abs(1 - speed) * 100:.2f}% "
              f"{'slower' if speed < 1 else 'faster'}; median of "
              f"per-round ratios), process CPU per step {cpu:.4f} ({(cpu - 1) * 100:+.2f}%), live thread's CPU "
              f"{share * 100:.2f}% of a step's ({per_record * 1e3:.2f} ms per metric record sent)")


if __name__ == "__main__":
    main()
