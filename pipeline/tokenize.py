"""Stage tokenize: the tokenizer and the token shards of both splits (data/tokens).
The stage's code is :mod:`marin.data.tokenize_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("tokenize")
