"""Stage curate: raw archives into normalized, filtered, deduplicated, split documents (data/curated).
The stage's code is :mod:`marin.data.curate_stage` (``dvc repro`` runs ``python -m pipeline.curate``)."""

from marin.data import curate_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(curate_stage.run_stage)
