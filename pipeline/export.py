"""Stage export: the model as a Hugging Face checkpoint (models/hf).
The stage's code is :mod:`marin.export.export_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("export")
