"""Stage train: a decoder-only transformer on the token shards, recorded step by step.

The XLA thread count and device count come from params.yaml (runtime) and are set
before jax starts: they decide the bits. An unfinished run of the same recipe is
resumed from its last complete checkpoint. With ``runtime.processes > 1`` this command
starts the worker processes itself on one machine, or is one of them on a cluster
(marin/train/distributed.py); process 0 alone records the run.
"""

from __future__ import annotations

from pathlib import Path

from marin.config import Params
from marin.train import distributed, runtime


def run_stage(root: Path, params: Params) -> bool:
    """The train stage; False in a process that must not mirror the run into MLflow."""
    topo = distributed.topology(params.runtime)
    if topo.launch:  # one machine: start the workers, each runs this stage again
        distributed.launch_local(root, params.runtime.processes)
        return False  # process 0 mirrored the run into MLflow
    runtime.configure(params.runtime)  # before jax initializes
    distributed.initialize(topo, params.runtime)
    from marin.train import loop

    loop.run(root, params, topo)
    distributed.shutdown(topo)
    return topo.primary

