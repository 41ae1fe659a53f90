"""Evaluation: the scoring of documents, the unigram baseline and greedy decoding
(:mod:`marin.evaluate.scoring`), and the evaluate stage (:mod:`marin.evaluate.evaluate_stage`)."""
