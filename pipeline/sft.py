"""Stage sft: the base model fine-tuned on the instruction set (models/instruct).
The stage's code is :mod:`marin.instruct.sft_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("sft")
