"""Stage wall time with the MLflow sync against without it, for the train stage.

    uv run dvc repro tokenize && uv run python benchmarks/bench_tracking.py [--steps 100] [--rounds 2]

Copies the project (code, params, data/tokens) into a temporary git repo, then runs the
train stage alternately with MARIN_MLFLOW=off and on (the embedded SQLite store, created
beforehand as a real project would have it), timing whole processes. Prints the ratio;
asserts nothing. The sync's cost is roughly constant, so the ratio shrinks as training
gets longer: the absolute overhead is printed too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FILES = ("marin", "pipeline", "schemas", "tokenizer", "dvc.yaml", "params.yaml", "pyproject.toml", "uv.lock")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not (ROOT / "data/tokens/manifest.json").is_file():
        sys.exit("run `uv run dvc repro tokenize` first")
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp) / "proj"
        proj.mkdir()
        for f in FILES:
            (shutil.copytree if (ROOT / f).is_dir() else shutil.copy2)(ROOT / f, proj / f)
        (proj / "data").mkdir()
        shutil.copytree(ROOT / "data/tokens", proj / "data/tokens")
        params = yaml.safe_load((proj / "params.yaml").read_text())
        params["train"]["steps"] = a.steps
        params["train"]["warmup_steps"] = min(params["train"]["warmup_steps"], a.steps - 1)
        (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
        subprocess.run([sys.executable, "-c", "from mlflow import MlflowClient; "
                        f"MlflowClient('sqlite:///{proj / 'mlflow.db'}').search_experiments()"], check=True)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(a.rounds):
            for mode in ("off", "on"):
                shutil.rmtree(proj / "models", ignore_errors=True)
                env = {**os.environ, "MARIN_MLFLOW": mode}
                env.pop("MLFLOW_TRACKING_URI", None)
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "pipeline.train"], cwd=proj, env=env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[mode].append(time.perf_counter() - t)
    off, on = min(times["off"]), min(times["on"])
    print(f"train stage, {a.steps} steps, best of {a.rounds} alternating rounds")
    print(f"without MLflow sync: {off:7.1f} s")
    print(f"with MLflow sync:    {on:7.1f} s   (+{on - off:.1f} s)")
    print(f"ratio with/without:  {on / off:.3f}")


if __name__ == "__main__":
    main()
