"""Stage evalsets: the built-in harness tasks' data, cut from the curated validation split (data/evalsets).
The stage's code is :mod:`marin.evaluate.evalsets_stage` (``dvc repro`` runs ``python -m pipeline.evalsets``)."""

from marin.evaluate import evalsets_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(evalsets_stage.run_stage)
