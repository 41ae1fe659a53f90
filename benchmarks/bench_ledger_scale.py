"""Ledger commands against history: CPU and peak RSS at 10 ... 10,000 runs, and a 1,000,000-record run.

    uv run python benchmarks/bench_ledger_scale.py [--sizes 10,100,1000,10000] [--records 1000000]
                                                   [--mlflow-max 1000]

A real tiny pipeline (the test corpus, a tiny model: fetch → evaluate) is built once; each
size N is that project plus N synthetic runs of older pipelines (fetch, curate, tokenize,
train with metrics and checkpoints, evaluate; chained by digest), written with the ledger's
own record API (``Record.create``: validated, canonical, hash-chained, with Merkle roots).
Every command runs as its own process, forked by a tiny launcher that reads the child's
own CPU time and peak RSS with ``os.wait4`` (tests/proc.py); each is run twice, cold (the derived index is
built on first use) and warm. The per-stage sync (one new run after a full sync filled the mirror;
above --mlflow-max, where a full sync takes hours, the index alone is told every run is mirrored)
runs once. Growth exponents are least-squares slopes of log CPU over
log runs (0: independent of history; 1: linear). Prints; asserts nothing.

The 1,000,000-record train run is appended through ``RunFile`` (with fsync turned off while
building: a million fsyncs measure the disk, not the ledger), then ``run.finished`` is timed
in that process (the appender kept the Merkle range) and in a fresh one (seeded from the
index), and ``ledger check`` is measured on it: records per CPU second and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from marin import hashing  # noqa: E402
from marin.ledger import merkle  # noqa: E402
from marin.ledger.records import Record, exact  # noqa: E402
from tests import proc  # noqa: E402
from tests.conftest import built_project, env_for_subprocess, make_corpus  # noqa: E402

PY = sys.executable
STARTUP = """
import sys
from pathlib import Path
from marin import config, stages
from marin.ledger import Input, Recipe
from marin.ledger.run import Plan
from marin.train.resume import find_resumable
root = Path.cwd()
p = config.load(root / "params.yaml")
plan = Plan.make(root, Recipe("train", p.section("seed", "model", "train", "runtime"), [Input("tokens", "data/tokens")],
                              closure=stages.code_files(root, "train")))
find_resumable(root, plan.recipe_digest)
"""
SYNC = "from pathlib import Path; from marin.tracking.sync import sync; print(sync(Path.cwd(), full=%s).summary())"


def measure(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(CPU s, peak RSS MB, exit code) of one command, as its own process (tests/proc.py)."""
    c = proc.measure(cwd, *argv, env={**env_for_subprocess(), **(env or {})}, timeout=3600)
    return c.cpu_s, c.rss_kib / 1024, c.code


# -- synthetic history ---------------------------------------------------------------------

def _rid(stage: str, t: float, rng: random.Random) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
    return f"{stage}-{stamp}-{rng.getrandbits(32):08x}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


def _d(rng: random.Random) -> str:
    return "sha256:" + rng.getrandbits(256).to_bytes(32, "big").hex()


def write_run(runs: Path, stage: str, t: float, rng: random.Random, started: dict, records: list[tuple[str, dict]],
              outputs: list[dict]) -> str:
    """One run file through the record API: run.started, the records, run.finished with its Merkle root."""
    rid = _rid(stage, t, rng)
    tree, prev, lines = merkle.Builder(), None, []
    for i, (kind, body) in enumerate([("run.started", started), *records]):
        rec = Record.create(rid, i, prev, kind, body, time=_iso(t + i * 1e-3))
        tree.append(hashing.parse(rec.digest))
        prev = rec.digest
        lines.append(rec.line())
    fin = Record.create(rid, len(lines), prev, "run.finished", {
        "status": "succeeded", "outputs": [{"name": o["name"], "digest": o["digest"]} for o in outputs],
        "merkle_root": hashing.fmt(tree.root()), "records": len(lines), "wall_s": 1.0, "ledger_s": 0.01},
        time=_iso(t + 1))
    (runs / f"{rid}.jsonl").write_bytes(b"".join(lines) + fin.line())
    return rid


def history(root: Path, n_runs: int, seed: int = 7) -> None:
    """``n_runs`` synthetic runs (chains of five stages), all older than the real pipeline."""
    rng, runs = random.Random(seed), root / "ledger" / "runs"
    base = json.loads(next(runs.glob("curate-*.jsonl")).read_bytes().splitlines()[0])["body"]
    t0 = time.time() - 400 * 86400
    for c in range(math.ceil(n_runs / 5)):
        t = t0 + c * 600
        digests = {k: _d(rng) for k in ("archive", "train", "tokens", "model", "ckpt")}
        chain = [
            ("fetch", [], [("archive:x", "archive")]),
            ("curate", [("archive:x", "archive")], [("train", "train")]),
            ("tokenize", [("train", "train")], [("tokens", "tokens")]),
            ("train", [("tokens", "tokens")], [("model", "model")]),
            ("evaluate", [("model", "model"), ("tokens", "tokens")], []),
        ]
        for k, (stage, ins, outs) in enumerate(chain[: n_runs - 5 * c]):
            inputs = [{"name": n, "path": f"data/history/{c}/{n}", "digest": digests[d], "size": 100}
                      for n, d in ins]
            outputs = [{"name": n, "path": f"data/history/{c}/{n}", "digest": digests[d], "size": 100,
                        "type": "file", "dvc_md5": "0" * 32} for n, d in outs]
            started = {**base, "stage": stage, "recipe_digest": _d(rng),
                       "inputs": [{"name": i["name"], "digest": i["digest"]} for i in inputs]}
            records = [("input", i) for i in inputs] + [("output", o) for o in outputs]
            if stage == "train":
                records += [("metric", {"step": s, "values": {"loss": exact(3.0 / s), "lr": exact(1e-3)}})
                            for s in range(10, 110, 10)]
                records += [("checkpoint", {"step": 50, "path": f"checkpoints/h{c}/50", "digest": digests["ckpt"],
                                            "params_digest": digests["ckpt"], "loader": {"epoch": 0, "index": 1},
                                            "leaves": 4})]
            if stage == "evaluate":
                records += [("eval", {"name": "model", "split": "validation",
                                      "values": {"bits_per_byte": exact(2.0 + rng.random())}})]
            write_run(runs, stage, t + k * 60, rng, started, records, outputs)


# -- measurements --------------------------------------------------------------------------

COMMANDS = {
    "ledger check": ("-m", "marin.cli", "ledger", "check"),
    "ledger log": ("-m", "marin.cli", "ledger", "log"),
    "lineage models/final": ("-m", "marin.cli", "lineage", "models/final"),
    "stage start-up": ("-c", STARTUP),
    "report": ("-m", "marin.cli", "report"),
}


def at_size(base: Path, work: Path, n: int, mlflow_max: int) -> dict[str, tuple]:
    proj = work / f"n{n}"
    shutil.copytree(base, proj, symlinks=True)
    shutil.rmtree(proj / ".marin" / "index", ignore_errors=True)
    history(proj, n)
    runs = len(list((proj / "ledger" / "runs").glob("*.jsonl")))
    out: dict[str, tuple] = {"runs": (runs,)}
    for name, argv in COMMANDS.items():
        cold = measure(proj, PY, *argv)
        warm = measure(proj, PY, *argv)
        out[name] = (cold, warm)
        print(f"    {name}: cold {cold[0]:.2f} s, warm {warm[0]:.2f} s CPU, {warm[1]:.0f} MB", flush=True)
    env = {"MARIN_MLFLOW": "on", "MLFLOW_TRACKING_URI": f"sqlite:///{proj / 'mlflow.db'}"}
    if n <= mlflow_max:  # the mirror must hold every run first: a full sync, then one new run
        out["full sync (fills the mirror)"] = (measure(proj, PY, "-c", SYNC % True, env=env),) * 2
    else:  # a full sync of this many runs takes hours here: the index alone is told they are mirrored
        mark_mirrored(proj, env["MLFLOW_TRACKING_URI"])
    history_one(proj)
    out["per-stage sync"] = (measure(proj, PY, "-c", SYNC % False, env=env),) * 2
    full = out.get("full sync (fills the mirror)", ((math.nan,),))[0][0]
    print(f"    full sync {full:.1f} s, per-stage sync {out['per-stage sync'][0][0]:.2f} s CPU", flush=True)
    return out


def mark_mirrored(proj: Path, uri: str) -> None:
    """Record in the index that every run is mirrored at ``uri`` (MLflow holds none of them: the
    per-stage sync's ledger side is measured at this size, its MLflow side up to --mlflow-max)."""
    from marin.ledger import mirror
    from marin.ledger.index import Index

    idx = Index.open(proj)
    try:
        for rid in mirror.unsynced(idx, uri):
            row = idx.run(rid)
            mirror.mark_synced(idx, uri, rid, row.last_seq, row.last_digest)
    finally:
        idx.close()


def history_one(proj: Path) -> None:
    """One more run, as a stage would have just written it."""
    rng = random.Random(99)
    runs = proj / "ledger" / "runs"
    base = json.loads(next(runs.glob("curate-*.jsonl")).read_bytes().splitlines()[0])["body"]
    write_run(runs, "curate", time.time(), rng, {**base, "recipe_digest": _d(rng), "inputs": []}, [], [])


def exponent(xs: list[float], ys: list[float]) -> float:
    pts = [(math.log(x), math.log(max(y, 1e-3))) for x, y in zip(xs, ys, strict=True)]
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def table(results: dict[int, dict[str, tuple]]) -> None:
    sizes = sorted(results)
    names = [k for k in [*COMMANDS, "per-stage sync", "full sync (fills the mirror)"]
             if all(k in results[n] for n in sizes[:1])]
    print(f"\n{'command':22} " + " ".join(f"{results[n]['runs'][0]:>14,} runs" for n in sizes)
          + "   exponent   added (largest - smallest)")
    for name in names:
        have = [n for n in sizes if name in results[n]]
        cells = []
        for n in sizes:
            if name not in results[n]:
                cells.append(f"{'n/a':>19}")
                continue
            _cold, (w_cpu, w_rss, code) = results[n][name]
            cells.append(f"{w_cpu:6.2f}s {w_rss:5.0f}MB{'' if code == 0 else ' !'}{' ' * (4 if code == 0 else 2)}")
        xs = [results[n]["runs"][0] for n in have]
        ys = [results[n][name][1][0] for n in have]
        slope = f"   {exponent(xs, ys):+.2f}      {ys[-1] - ys[0]:+.2f}s" if len(have) > 1 else ""
        print(f"{name:22} " + " ".join(cells) + slope)
    print("(warm: the index exists; CPU seconds and peak RSS of the command's own process)")
    print("cold (first run of each command on a fresh copy; the first builds the index):")
    for name in COMMANDS:
        print(f"  {name:20} " + " ".join(f"{results[n][name][0][0]:6.2f}s {results[n][name][0][1]:5.0f}MB    "
                                         for n in sizes))


def long_run(work: Path, base: Path, n_records: int) -> None:
    """A train run of ``n_records`` records: run.finished, then ledger check."""
    proj = work / "long"
    shutil.copytree(base, proj, symlinks=True)
    script = f"""
import os, time, resource
from pathlib import Path
from marin.ledger.store import RunFile
from marin.ledger.records import exact, new_run_id
import json
root = Path.cwd()
started = json.loads(next((root / "ledger/runs").glob("train-*.jsonl")).read_bytes().splitlines()[0])["body"]
rid = new_run_id("train")
f = RunFile(root / "ledger" / "runs" / f"{{rid}}.jsonl", rid)
fsync, os.fsync = os.fsync, lambda fd: None  # building only: a million fsyncs would measure the disk
f.append("run.started", started)
t = time.process_time()
for s in range(1, {n_records}):
    f.append("metric", {{"step": s, "values": {{"loss": exact(1.0 + 1.0 / s), "lr": exact(1e-3)}}}})
build = time.process_time() - t
os.fsync = fsync
t = time.process_time()
fin = f.append("run.finished", lambda n, root_: {{"status": "succeeded", "outputs": [], "merkle_root":
               "sha256:" + root_.hex(), "records": n, "wall_s": 1.0, "ledger_s": 1.0}})
print(json.dumps({{"run_id": rid, "build_cpu_s": build, "finish_cpu_s": time.process_time() - t,
                  "records": fin.body["records"]}}))
"""
    p = subprocess.run([PY, "-c", script], cwd=proj, capture_output=True, text=True, check=True,
                       env=env_for_subprocess())
    info = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\n1 run of {info['records'] + 1:,} records: appended in {info['build_cpu_s']:.0f} CPU s "
          f"({info['records'] / info['build_cpu_s']:,.0f} records/s, fsync off)")
    print(f"  run.finished in the appending process: {info['finish_cpu_s'] * 1000:.1f} ms CPU")
    path = proj / "ledger" / "runs" / f"{info['run_id']}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    fresh = ("-c", "from pathlib import Path; from marin.ledger.store import RunFile; import sys; "
             f"p = Path('{path}'); RunFile(p, p.stem).append('run.finished', lambda n, r: "
             "{'status': 'succeeded', 'outputs': [], 'merkle_root': 'sha256:' + r.hex(), 'records': n, "
             "'wall_s': 1.0, 'ledger_s': 1.0})")
    path.write_bytes(b"".join(lines[:-1]))  # the same run, unfinished again (as after a crash)
    shutil.rmtree(proj / ".marin" / "index", ignore_errors=True)
    cpu, rss, _ = measure(proj, PY, *fresh)
    print(f"  run.finished in a fresh process, no index (reads the run once): {cpu:.2f} s CPU, {rss:.0f} MB")
    path.write_bytes(b"".join(lines[:-1]))
    cpu, rss, _ = measure(proj, PY, "-m", "marin.cli", "ledger", "log")  # any command keeps the index current
    print(f"  index brought up to date by any command (here: the run file was rewritten): {cpu:.2f} s CPU")
    cpu, rss, _ = measure(proj, PY, *fresh)
    print(f"  run.finished in a fresh process, index current (a resumed run): {cpu:.2f} s CPU, {rss:.0f} MB")
    records = sum(q.read_bytes().count(b"\n") for q in (proj / "ledger" / "runs").glob("*.jsonl"))
    cpu, rss, code = measure(proj, PY, "-m", "marin.cli", "ledger", "check")
    print(f"  ledger check: {records:,} records in {cpu:.1f} s CPU = {records / cpu:,.0f} records/s, "
          f"peak RSS {rss:.0f} MB (exit {code})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,100,1000,10000", help="comma-separated; empty: only the long run")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--mlflow-max", type=int, default=1000,
                    help="largest size whose MLflow mirror is filled (a full sync) before the per-stage sync; "
                         "above it only the index is told the runs are mirrored")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        corpus = work / "corpus"
        make_corpus(corpus)
        print("building the real tiny pipeline (fetch → evaluate) ...", flush=True)
        base = built_project(work / "base", corpus, ("fetch", "curate", "tokenize", "train", "evaluate"), shrink=True)
        results = {}
        for n in (int(x) for x in a.sizes.split(",") if x):
            print(f"  {n} runs of history ...", flush=True)
            results[n] = at_size(base.root, work, n, a.mlflow_max)
        if results:
            table(results)
        if a.records:
            long_run(work, base.root, a.records)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
