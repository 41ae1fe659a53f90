"""The evaluate stages' metrics files: measurements apart from their baselines, counts and settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marin.errors import StageError
from marin.evaluate import metrics_file

DOC = {"bits_per_byte": 2.5, "perplexity": 40.0, "per_corpus": {"a": 2.4}, "unigram_bits_per_byte": 3.1,
       "unigram_per_corpus": {"a": 3.0},
       "harness": {"t": {"acc": 0.5, "acc_stderr": 0.1, "clean/acc": 0.4, "chance/acc": 0.25, "constant/acc": 0.3,
                         "unigram/acc": 0.2, "better/acc": "higher", "samples": 4, "clean/samples": 3,
                         "num_fewshot": 0, "fewshot_seed": 1234, "limit": 0.5}},
       "instruct": {"exact_match": 0.0, "examples": 9, "by_task": {"qa": {"exact_match": 0.0, "examples": 3}}}}


def test_split_keeps_only_measurements_and_merge_gives_the_document_back() -> None:
    metrics, context = metrics_file.split(DOC)  # every measurement a headline
    assert metrics == {"bits_per_byte": 2.5, "perplexity": 40.0, "per_corpus": {"a": 2.4},
                       "harness": {"t": {"acc": 0.5, "acc_stderr": 0.1, "clean/acc": 0.4}},
                       "instruct": {"exact_match": 0.0, "by_task": {"qa": {"exact_match": 0.0}}}}
    assert context["harness"]["t"] == {"chance/acc": 0.25, "constant/acc": 0.3, "unigram/acc": 0.2,
                                       "better/acc": "higher", "samples": 4, "clean/samples": 3, "num_fewshot": 0,
                                       "fewshot_seed": 1234, "limit": 0.5}
    assert context["unigram_per_corpus"] == {"a": 3.0} and context["instruct"]["by_task"]["qa"] == {"examples": 3}
    assert metrics_file.merge(metrics, context) == DOC
    assert json.dumps(metrics_file.merge(metrics, context), sort_keys=True) == json.dumps(DOC, sort_keys=True)


def test_the_headlines_are_bits_per_byte_each_task_s_score_and_each_model_s_accuracies() -> None:
    doc = {**DOC, "harness": {**DOC["harness"], "w": {"word_perplexity": 9.0, "bits_per_byte": 1.0,
                                                      "bits_per_byte_stderr": 0.1, "better/bits_per_byte": "lower"}}}
    metrics, context = metrics_file.split(doc, metrics_file.evaluation_headline)
    assert metrics == {"bits_per_byte": 2.5, "harness": {"t": {"acc": 0.5}, "w": {"bits_per_byte": 1.0}}}
    assert context["harness"]["t"]["acc_stderr"] == 0.1 and context["per_corpus"] == {"a": 2.4}
    assert metrics_file.merge(metrics, context) == doc  # nothing lost: the readers merge the two
    inst = {m: {"token_acc": 0.5, "choice_acc": 0.4, "exact_match": 0.1, "examples": 9,
                "by_task": {"qa": {"token_acc": 0.3}}} for m in ("base", "instruct")}
    metrics, context = metrics_file.split(inst, metrics_file.instructions_headline)
    assert metrics == {m: {"token_acc": 0.5, "choice_acc": 0.4} for m in inst}
    assert metrics_file.merge(metrics, context) == inst


@pytest.mark.parametrize("values, expected", [
    ({"acc": 0.5, "acc_norm": 0.6, "perplexity": 3.0}, "acc"),
    ({"exact_match": 0.5, "exact_match_stderr": 0.1, "clean/exact_match": 0.4}, "exact_match"),
    ({"word_perplexity": 9.0, "byte_perplexity": 2.0, "chance/x": 0.5}, "byte_perplexity"),
    ({"samples": 4}, None),
])
def test_a_task_s_headline_is_its_accuracy_else_its_first_metric(values, expected) -> None:
    assert metrics_file.task_headline(values) == expected


def test_read_merges_the_two_files_and_takes_a_metrics_file_alone(tmp_path: Path) -> None:
    metrics, context = metrics_file.split(DOC)
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    assert metrics_file.read(tmp_path, Path("m.json"), Path("c.json"), StageError) == metrics  # written before
    (tmp_path / "c.json").write_text(json.dumps(context))
    assert metrics_file.read(tmp_path, Path("m.json"), Path("c.json"), StageError) == DOC
