"""Tensor-level work of ``marin verify``, run in the verifier's workspace with the recorded runtime.

    python -m marin.train.replay segments --checkpoints DIR --intervals S:E,S:E --out OUT.json [--stage sft]
    python -m marin.train.replay compare --a DIR --b DIR --steps 50,100 --out OUT.json [--stage sft]

``segments`` restores, for each interval, the checkpoint at step S of a recorded run (S = 0:
a fresh init), trains to step E exactly as the train stage does, and reports the exact
metrics of every logged step and the state digest at E. ``compare`` restores two runs' checkpoints at the
same steps and reports, per step, both digests and, for each tensor that differs, the
largest absolute and relative difference. Both read params.yaml of the workspace and set
the XLA thread and device count from it before jax starts, like the stage.
``--stage sft``: the run is the instruction fine-tune's (marin.instruct.sft), not train's.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from marin import config, hashing
from marin.paths import project_root
from marin.train import runtime

if TYPE_CHECKING:  # imported after the runtime is configured
    from marin.train.job import Job, Setup


def distances(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """For every tensor whose bytes differ: max |a-b|, max |a-b| / max(|a|, tiny), and the flat index of
    its first differing value."""
    out = {}
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            out[name] = {"max_abs": None, "max_rel": None,
                         "note": "missing or of another shape/dtype in one of the two states"}
            continue
        if x.tobytes() == y.tobytes():
            continue
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        diff = np.abs(xf - yf)
        rel = diff / np.maximum(np.abs(xf), np.finfo(np.float64).tiny)
        out[name] = {"max_abs": float(diff.max()), "max_rel": float(rel.max()),
                     "differing": int(np.count_nonzero(x != y)), "size": int(x.size),
                     "first_index": _first(x, y)}
    return out


def _first(x: np.ndarray, y: np.ndarray) -> int:
    """The flat index of the first element whose bytes differ (a NaN or a signed zero included)."""
    bits = f"u{x.dtype.itemsize}"
    return int(np.flatnonzero(x.reshape(-1).view(bits) != y.reshape(-1).view(bits))[0])


# The training job each training stage runs, by module and name: imported only after the runtime is
# configured (JAX reads its flags at import), and named here, not imported, because sft (marin.instruct)
# builds on this package.
JOBS = {"train": ("marin.train.loop", "PRETRAIN"), "sft": ("marin.instruct.sft", "JOB")}


def _job(stage: str) -> Job:
    """The training job a run of ``stage`` ran (imported after the runtime is configured)."""
    module, name = JOBS["sft" if stage == "sft" else "train"]
    return getattr(importlib.import_module(module), name)


def _load(root: Path, one_process: bool = False, stage: str = "train") -> tuple[config.Params, Job, Setup]:
    """The recorded params, the stage's job and its setup. ``one_process``: a multi-process run's
    mesh in this one process (restoring and digesting checkpoints gives the same tensors)."""
    params = config.load(root / "params.yaml")
    if one_process:
        params = dataclasses.replace(params, runtime=runtime.single_process(params.runtime))
    runtime.configure(params.runtime)  # before jax initializes
    job = _job(stage)
    return params, job, job.setup(root, params)


def segments(root: Path, ckpt_dir: Path, intervals: list[tuple[int, int]], stage: str = "train") -> dict[str, Any]:
    """Replay each interval (start, end] from the recorded checkpoint at ``start``, in one process
    (one compile for all of them)."""
    params, job, su = _load(root, stage=stage)
    from marin import env
    from marin.train import checkpoint, loop

    ckpts = checkpoint.Checkpoints(ckpt_dir, create=False)
    on_disk = set(ckpts.steps())
    results = []
    for start, end in intervals:
        if start == 0:
            state, start_digest = su.init_state(params), None
        elif start in on_disk:
            state, _ = ckpts.restore(start, su.abstract, su.shardings)
            start_digest = checkpoint.state_digest(state)
        else:
            results.append({"start": start, "end": end, "start_digest": None, "missing": start})
            continue
        metrics: dict[str, Any] = {}
        if su.rounding is not None:  # universal: the recorded log's directions (MARIN_ROUNDING_LOG), from start
            su.rounding.open(None, start)
        for i in range(start, end):
            state, m = su.step(state, i)
            if loop.is_log_step(su.tp, i + 1):
                metrics[str(i + 1)] = su.metric_values(m, i, state.params)
            if su.rounding is not None:
                su.rounding.end_step(i + 1, durable=False)
        if su.rounding is not None:
            su.rounding.close()
        res: dict[str, Any] = {"start": start, "end": end, "start_digest": start_digest,
                               "end_digest": checkpoint.state_digest(state), "metrics": metrics, "distances": None}
        if end in on_disk:  # name the tensors that differ from what the recorded run left on disk
            recorded, _ = ckpts.restore(end, su.abstract, su.shardings)
            res["recorded_end_digest"] = checkpoint.state_digest(recorded)
            res["distances"] = distances(checkpoint.tensors(recorded), checkpoint.tensors(state))
        results.append(res)
    ckpts.close()
    fp = env.fingerprint()
    return {"determinism_class": runtime.determinism_class(params.runtime, fp), "env": fp,
            "code_digest": env.code_state(root)["code_digest"],
            "params": params.section(*job.sections), "intervals": results}


def compare(root: Path, dir_a: Path, dir_b: Path, steps: list[int], stage: str = "train") -> dict[str, Any]:
    _, _, su = _load(root, one_process=True, stage=stage)
    from marin.train import checkpoint

    a, b = checkpoint.Checkpoints(dir_a, create=False), checkpoint.Checkpoints(dir_b, create=False)
    have_a, have_b = set(a.steps()), set(b.steps())
    out: dict[str, Any] = {}
    for s in steps:
        ta = checkpoint.tensors(a.restore(s, su.abstract, su.shardings)[0]) if s in have_a else None
        tb = checkpoint.tensors(b.restore(s, su.abstract, su.shardings)[0]) if s in have_b else None
        out[str(s)] = {
            "a_digest": hashing.tree_digest(ta) if ta is not None else None,
            "b_digest": hashing.tree_digest(tb) if tb is not None else None,
            "distances": distances(ta, tb) if ta is not None and tb is not None else None,
        }
    a.close()
    b.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m marin.train.replay", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    seg = sub.add_parser("segments")
    seg.add_argument("--checkpoints", type=Path, required=True)
    seg.add_argument("--intervals", required=True, help="comma-separated START:END")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--a", type=Path, required=True)
    cmp_.add_argument("--b", type=Path, required=True)
    cmp_.add_argument("--steps", required=True, help="comma-separated steps")
    for p in (seg, cmp_):
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--stage", default="train", choices=("train", "sft"), help="the recorded run's stage")
    args = ap.parse_args(argv)
    root = project_root()
    if args.cmd == "segments":
        bounds = [tuple(int(x) for x in iv.split(":")) for iv in args.intervals.split(",") if iv]
        result = segments(root, args.checkpoints, [(a, b) for a, b in bounds], args.stage)
    else:
        result = compare(root, args.a, args.b, [int(s) for s in args.steps.split(",") if s], args.stage)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    from marin.allocator import restart_with_fast_allocator

    restart_with_fast_allocator()
    sys.exit(main())
