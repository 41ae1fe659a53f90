"""The end of a training run: the released model and the training curve, recorded in its ledger run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from marin import fsutil, hashing
from marin.ledger import Run
from marin.ledger.store import read_run
from marin.train import rounding_log, weights
from marin.train.step import ModelParams

if TYPE_CHECKING:
    from marin.train.job import Job, Setup


def publish(root: Path, run: Run, su: Setup, job: Job, params: ModelParams, n_params: int, steps: int) -> None:
    """The released model and the training curve (exact values, so it repeats bit for bit)."""
    with fsutil.atomic_dir(root / job.model) as tmp:
        meta = {"n_params": n_params, "step": steps, "recipe_digest": run.recipe_digest, **job.model_meta(root, su)}
        if su.rounding is not None and su.rounding.path is not None:  # universal: the whole log, beside the weights
            shutil.copyfile(su.rounding.path, tmp / rounding_log.LOG_FILE)
            meta["rounding_log"] = {"file": rounding_log.LOG_FILE, "tau": su.rounding.tau,
                                    "entries": su.rounding.total(),
                                    "digest": hashing.file_digest(tmp / rounding_log.LOG_FILE)}
        tensor_digest = weights.save(tmp, params, su.cfg, meta)
        rec = run.output("model", job.model, source=tmp, tensor_digest=tensor_digest,  # recorded, then published
                         meta={"n_params": n_params, "step": steps})
    write_curve(root, run, job)
    print(f"{job.stage}: {n_params:,} parameters, {steps} steps, final model {job.model}: tensor digest "
          f"{tensor_digest} (over its tensors), folder digest {rec.body_as('output')['digest']} (over its files)")


def write_curve(root: Path, run: Run, job: Job) -> None:
    rows = ["step,loss,lr,grad_norm,val_loss"]
    for m in read_run(run.file.path, validate=False).bodies("metric"):
        v = m["values"]
        val = repr(v["val_loss"]["value"]) if "val_loss" in v else ""
        rows.append(f"{m['step']},{v['loss']['value']!r},{v['lr']['value']!r},{v['grad_norm']['value']!r},{val}")
    fsutil.write_bytes(root / job.curve, ("\n".join(rows) + "\n").encode(),
                       before_publish=lambda tmp: run.output(f"{job.stage}_curve", job.curve, source=tmp))
