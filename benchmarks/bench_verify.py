"""Cost of `marin verify --segments K` against a full replay of the same train run.

    uv run dvc repro tokenize && uv run python benchmarks/bench_verify.py [--steps 160] [--every 20] [--k 2]

Copies the project (code, params, data/tokens) into a temporary git repo, trains the
default model once with ``steps / every`` checkpoint intervals, then times whole
``marin verify`` processes, alternating a full replay and a K-segment replay (a new
seed each round). Prints both times and their ratio beside K/N; asserts nothing.
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
FILES = ("marin", "pipeline", "schemas", "closures", "tokenizer", "dvc.yaml", "params.yaml", "pyproject.toml",
         "uv.lock", ".gitignore")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--every", type=int, default=20, help="checkpoint interval")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not (ROOT / "data/tokens/manifest.json").is_file():
        sys.exit("run `uv run dvc repro tokenize` first")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_")} | {"MARIN_MLFLOW": "off"}
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp) / "proj"
        proj.mkdir()
        for f in FILES:
            _ = shutil.copytree(ROOT / f, proj / f, symlinks=True) if (ROOT / f).is_dir() else shutil.copy2(
                ROOT / f, proj / f)
        shutil.copytree(ROOT / "data/tokens", proj / "data/tokens")
        params = yaml.safe_load((proj / "params.yaml").read_text())
        params["train"].update(steps=a.steps, checkpoint_every=a.every,
                               warmup_steps=min(params["train"]["warmup_steps"], a.steps - 1))
        (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=bench", "-c", "user.email=b@x", "commit",
                                                   "-qm", "bench"]):
            subprocess.run(["git", *cmd], cwd=proj, check=True)
        train_s = _run([sys.executable, "-m", "pipeline.train"], proj, env)
        [run] = [p.name.removesuffix(".jsonl") for p in (proj / "ledger/runs").glob("train-*.jsonl")]
        n = a.steps // a.every
        times: dict[str, list[float]] = {"full": [], "segments": []}
        for r in range(a.rounds):
            times["full"].append(_run([sys.executable, "-m", "marin.cli", "verify", run], proj, env))
            times["segments"].append(_run([sys.executable, "-m", "marin.cli", "verify", "--segments", str(a.k),
                                           "--seed", str(r), run], proj, env))
    full, seg = min(times["full"]), min(times["segments"])
    print(f"train run: {a.steps} steps, {n} checkpoint intervals, trained in {train_s:.1f} s")
    print(f"marin verify (full replay):      best {full:.1f} s of {[round(t, 1) for t in times['full']]}")
    print(f"marin verify --segments {a.k}:       best {seg:.1f} s of {[round(t, 1) for t in times['segments']]}")
    print(f"ratio segments/full: {seg / full:.3f}  (K/N = {a.k}/{n} = {a.k / n:.3f}; the rest is fixed cost: "
          "worktree, input restore, jax start and compile)")


if __name__ == "__main__":
    main()
