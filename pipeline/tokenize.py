"""Stage tokenize: the tokenizer and the token shards of both splits (data/tokens).
The stage's code is :mod:`marin.data.tokenize_stage` (``dvc repro`` runs ``python -m pipeline.tokenize``)."""

from marin.data import tokenize_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(tokenize_stage.run_stage)
