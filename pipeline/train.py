"""Stage train: the model on the token shards, recorded step by step (models/final).
The stage's code is :mod:`marin.train.train_stage` (``dvc repro`` runs ``python -m pipeline.train``)."""

from marin.stage import stage_main
from marin.train import train_stage

if __name__ == "__main__":
    stage_main(train_stage.run_stage, fast_allocator=True)
