"""Stage decontaminate: the harness tasks' items checked against the training data by 13-gram overlap
(data/decontamination.json). The stage's code is :mod:`marin.evaluate.decontaminate_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("decontaminate")
