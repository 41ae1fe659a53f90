"""Stage fetch: every pinned raw source into data/raw/, verified by sha256.
The stage's code is :mod:`marin.data.fetch_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("fetch")
