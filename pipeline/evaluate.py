"""Stage evaluate: bits per byte, perplexity, baseline and samples (metrics/eval.json).
The stage's code is :mod:`marin.evaluate.evaluate_stage` (``dvc repro`` runs ``python -m pipeline.evaluate``)."""

from marin.evaluate import evaluate_stage
from marin.stage import stage_main

if __name__ == "__main__":
    stage_main(evaluate_stage.run_stage, fast_allocator=True)
