"""Stage evaluate_instruct: the base and the instruct model on the held-out instructions
(metrics/instruct_eval.json). The stage's code is :mod:`marin.evaluate.evaluate_instruct_stage`
(``dvc repro`` runs ``python -m pipeline.evaluate_instruct``)."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("evaluate_instruct")
