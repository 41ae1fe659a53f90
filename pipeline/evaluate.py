"""Stage evaluate: bits per byte, perplexity, baseline and samples (metrics/eval.json).
The stage's code is :mod:`marin.evaluate.evaluate_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("evaluate")
