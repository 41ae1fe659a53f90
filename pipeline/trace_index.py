"""Stage trace_index: the training data as a suffix-array index with a document table (data/trace_index),
which `marin trace` searches. The stage's code is :mod:`marin.evaluate.trace_index_stage`."""

from marin.stages.runner import stage_main

if __name__ == "__main__":
    stage_main("trace_index")
