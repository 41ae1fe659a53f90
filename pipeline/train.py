"""Stage train: the model on the token shards, recorded step by step (models/final).
The stage's code is :mod:`marin.train.train_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("train")
