"""Stage evalsets: the built-in harness tasks' data, cut from the curated validation split (data/evalsets).
The stage's code is :mod:`marin.data.evalsets_stage` (``dvc repro`` runs ``python -m pipeline.evalsets``)."""

from marin.data import evalsets_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(evalsets_stage.run_stage)
