"""Stage sft: the base model fine-tuned on the instruction set (models/instruct).
The stage's code is :mod:`marin.instruct.sft_stage` (``dvc repro`` runs ``python -m pipeline.sft``)."""

from marin.instruct import sft_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(sft_stage.run_stage, fast_allocator=True)
