"""Stage train: a decoder-only transformer on the token shards, recorded step by step.

The XLA thread count and device count come from params.yaml (runtime) and are set
before jax starts: they decide the bits. An unfinished run of the same recipe is
resumed from its last complete checkpoint.
"""

from pathlib import Path

from marin.config import Params
from marin.stage import stage_main
from marin.train import runtime


def train_stage(root: Path, params: Params) -> None:
    runtime.configure(params.runtime)  # before jax initializes
    from marin.train import loop

    loop.run(root, params)


if __name__ == "__main__":
    stage_main(train_stage)
