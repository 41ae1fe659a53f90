"""Stage instructions: the instruction set from the curated splits and your own conversations
(data/instructions). The stage's code is :mod:`marin.instruct.instructions_stage`
(``dvc repro`` runs ``python -m pipeline.instructions``)."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("instructions")
