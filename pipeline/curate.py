"""Stage curate: raw archives into normalized, filtered, deduplicated, split documents (data/curated).
The stage's code is :mod:`marin.data.curate_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("curate")
