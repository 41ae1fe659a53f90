"""Stage export: the model as a Hugging Face checkpoint (models/hf).
The stage's code is :mod:`marin.export.export_stage` (``dvc repro`` runs ``python -m pipeline.export``)."""

from marin.export import export_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(export_stage.run_stage)
