"""marin.tracking.live's thread in this process, against an embedded SQLite store: it sends what
the ledger holds, runs at the lowest CPU priority (the training's threads come first), and keeps
its CPU time (benchmarks/bench_live_metrics.py reports it)."""

from __future__ import annotations

import os

import pytest
from mlflow import MlflowClient

from marin.ledger import Recipe, Run, exact
from marin.tracking.live import Live


@pytest.fixture
def live_env(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for k, v in {"MLFLOW_TRACKING_URI": uri, "MARIN_MLFLOW": "on", "MARIN_MLFLOW_LIVE": "on",
                 "MARIN_MLFLOW_LIVE_EVERY": "2", "MARIN_MLFLOW_LIVE_SECONDS": "600"}.items():
        monkeypatch.setenv(k, v)
    for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):  # the thread sets them
        monkeypatch.setenv(k, os.environ.get(k, ""))
        monkeypatch.delenv(k)
    (tmp_path / "ledger" / "runs").mkdir(parents=True)
    return uri


def test_the_thread_sends_the_ledger_s_metrics(tmp_path, live_env) -> None:
    run = Run.start(tmp_path, Recipe("train", {}))
    live = Live.start(tmp_path, run.run_id)
    assert live.ready.wait(120) and live.failed is None, live.failed
    recorded = []
    for step in range(1, 6):
        run.record("metric", {"step": step, "values": {"loss": exact(1.0 / step)}})
        recorded.append((step, 1.0 / step))
        live.step()
    live.close()
    assert not live._thread.is_alive() and live.failed is None
    c = MlflowClient(live_env)
    (found,) = c.search_runs([c.get_experiment_by_name("marin").experiment_id],
                             filter_string=f"tags.`marin.run_id` = '{run.run_id}'")
    history = sorted((m.step, m.value) for m in c.get_metric_history(found.info.run_id, "loss"))
    assert history == recorded and live.sent == 5  # the last one sent when closing
    assert live.cpu_s > 0
    run.finish()


def test_off_starts_no_thread(tmp_path, live_env, monkeypatch) -> None:
    monkeypatch.setenv("MARIN_MLFLOW_LIVE", "off")
    run = Run.start(tmp_path, Recipe("train", {}))
    live = Live.start(tmp_path, run.run_id)
    live.step()
    live.close()
    assert not live._thread.is_alive() and live.sent == 0 and not (tmp_path / "mlflow.db").exists()
    run.finish()
