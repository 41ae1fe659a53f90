"""The evaluate stages' metrics files: measurements apart from their baselines, counts and settings."""

from __future__ import annotations

import json
from pathlib import Path

from marin.errors import StageError
from marin.evaluate import metrics_file

DOC = {"bits_per_byte": 2.5, "perplexity": 40.0, "per_corpus": {"a": 2.4}, "unigram_bits_per_byte": 3.1,
       "unigram_per_corpus": {"a": 3.0},
       "harness": {"t": {"acc": 0.5, "acc_stderr": 0.1, "clean/acc": 0.4, "chance/acc": 0.25, "constant/acc": 0.3,
                         "unigram/acc": 0.2, "better/acc": "higher", "samples": 4, "clean/samples": 3,
                         "num_fewshot": 0, "fewshot_seed": 1234, "limit": 0.5}},
       "instruct": {"exact_match": 0.0, "examples": 9, "by_task": {"qa": {"exact_match": 0.0, "examples": 3}}}}


def test_split_keeps_only_measurements_and_merge_gives_the_document_back() -> None:
    metrics, context = metrics_file.split(DOC)
    assert metrics == {"bits_per_byte": 2.5, "perplexity": 40.0, "per_corpus": {"a": 2.4},
                       "harness": {"t": {"acc": 0.5, "acc_stderr": 0.1, "clean/acc": 0.4}},
                       "instruct": {"exact_match": 0.0, "by_task": {"qa": {"exact_match": 0.0}}}}
    assert context["harness"]["t"] == {"chance/acc": 0.25, "constant/acc": 0.3, "unigram/acc": 0.2,
                                       "better/acc": "higher", "samples": 4, "clean/samples": 3, "num_fewshot": 0,
                                       "fewshot_seed": 1234, "limit": 0.5}
    assert context["unigram_per_corpus"] == {"a": 3.0} and context["instruct"]["by_task"]["qa"] == {"examples": 3}
    assert metrics_file.merge(metrics, context) == DOC
    assert json.dumps(metrics_file.merge(metrics, context), sort_keys=True) == json.dumps(DOC, sort_keys=True)


def test_read_merges_the_two_files_and_takes_a_metrics_file_alone(tmp_path: Path) -> None:
    metrics, context = metrics_file.split(DOC)
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    assert metrics_file.read(tmp_path, Path("m.json"), Path("c.json"), StageError) == metrics  # written before
    (tmp_path / "c.json").write_text(json.dumps(context))
    assert metrics_file.read(tmp_path, Path("m.json"), Path("c.json"), StageError) == DOC
