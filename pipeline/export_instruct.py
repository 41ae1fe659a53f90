"""Stage export_instruct: the instruct model as a Hugging Face checkpoint with its chat template
(models/hf-instruct). The stage's code is :mod:`marin.export.export_instruct_stage`
(``dvc repro`` runs ``python -m pipeline.export_instruct``)."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("export_instruct")
