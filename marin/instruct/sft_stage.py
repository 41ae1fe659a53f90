"""Stage sft: the base model (models/final) fine-tuned on the instruction set, through the train
stage's loop (marin.instruct.sft), into models/instruct. One process: the XLA thread and device
count come from params.yaml (runtime), as train's do."""

from __future__ import annotations

from pathlib import Path

from marin.config import Params
from marin.errors import ParamsError
from marin.train import distributed, runtime


def run_stage(root: Path, params: Params) -> None:
    """The sft stage: models/final and data/instructions into models/instruct, recorded as a ledger run."""
    if params.runtime.processes > 1:
        raise ParamsError(f"runtime.processes: {params.runtime.processes}; the sft stage runs in one process "
                          "(set runtime.processes: 1 for it)")
    runtime.configure(params.runtime)  # before jax initializes
    from marin.instruct import sft
    from marin.train import loop

    loop.run(root, params, distributed.Topology(1), sft.JOB)
