"""Stage evalsets: the built-in harness tasks' data, cut from the curated validation split (data/evalsets).
The stage's code is :mod:`marin.data.evalsets_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("evalsets")
