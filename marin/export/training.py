"""What an export's card says about how its model was trained, read from the ledger: the training run
(train or sft) that first wrote the exported model folder, its recorded hyperparameters, wall time and
machine. The earliest run that wrote those exact bytes; its ledger file is an input of the export run, so
that a replay (``marin verify``) reads the same run and writes the same card."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import hashing, stages
from marin.errors import StageError
from marin.ledger.query import Ledger
from marin.ledger.store import read_run


@dataclass(frozen=True)
class Training:
    """The training run behind an exported model: its id and stage, the hyperparameters it recorded
    (``params.yaml: train`` or ``sft``), the sequence length, its wall time (seconds), usable cores,
    CPU model, device count and backend, and the steps it checkpointed."""

    run_id: str
    stage: str
    hyper: dict[str, Any]
    seq_len: int
    wall_s: float
    cores: int
    cpu_model: str
    devices: int
    backend: str
    checkpoints: tuple[int, ...] = ()  # the steps of its checkpoint records: the Hub revisions step<N>


    @property
    def tokens(self) -> int:
        """Token positions trained on: steps × batch size × sequence length."""
        return int(self.hyper["steps"]) * int(self.hyper["batch_size"]) * self.seq_len

    @property
    def cpu_hours(self) -> float:
        return self.wall_s * self.cores / 3600


def training_run(root: Path, model: Path) -> Path:
    """The ledger file of the earliest succeeded training run whose ``model`` output is the folder ``model``
    as it is now: an input of the export run, so that a replay (whose ledger starts empty) gets it back."""
    digest = hashing.path_digest(root / model)
    with Ledger(root, sources=stages.SOURCE_STAGES) as ledger:
        found = [log for log, body in ledger.producers_of(digest)
                 if body.get("name") == "model" and log.status == "succeeded"]
    if not found:
        raise StageError(f"{model}: no succeeded train or sft run in the ledger wrote it ({digest}); "
                         "rerun `dvc repro` from train")
    return found[0].path.resolve().relative_to(root.resolve())


def training(root: Path, run_file: Path, seq_len: int) -> Training:
    """What the training run recorded in ``run_file`` (:func:`training_run`) says about its training."""
    log = read_run(root / run_file)
    start, env = log.start_body, log.env
    det: Mapping[str, Any] = start.get("determinism_class") or {}
    wall_s = float(log.end.body_as("run.finished")["wall_s"])
    return Training(log.run_id, start["stage"], dict(start["params"][start["stage"]]), seq_len,
                    wall_s, len(env.get("usable_cores") or []) or int(env["cpu_count"]),
                    str(env.get("cpu_model") or "not recorded"), int(det.get("device_count") or 1),
                    str(det.get("backend") or "cpu"), tuple(sorted({int(b["step"]) for b in log.bodies("checkpoint")})))
