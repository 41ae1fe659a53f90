"""The card that ``hf upload`` sends, rendered from plain values (issue 57, item 2): the Benchmarks table that the
report's card shows too (one renderer, :mod:`marin.export.benchmarks`), a registry task's ``model-index`` entry
under its Hub dataset id and split, the instruct card's every instruction metric, and a generation config that
``generate(..., max_new_tokens=...)`` does not warn about. The exported folders: tests/test_export.py and
tests/test_instruct_release.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from marin.evaluate import baselines as bl
from marin.export import benchmarks, card, hf, instruct_card

CLOZE = {"acc": 0.25, "acc_stderr": 0.05, "chance/acc": 0.0, "constant/acc": 0.3, "unigram/acc": 0.0,
         "better/acc": "higher", "samples": 40, "items": 40, "num_fewshot": 0, "fewshot_seed": 7,
         "contaminated": 2, "clean/acc": 0.2632, "clean/samples": 38, "decontamination_ngram": 13}
LAMBADA = {"acc": 0.5, "acc_stderr": 0.1, "perplexity": 900.0, "perplexity_stderr": 100.0, "better/acc": "higher",
           "better/perplexity": "lower", "constant/acc": 0.125, "unigram/acc": 0.0, "unigram/perplexity": 2000.0,
           "samples": 8, "items": 20, "limit": 8, "num_fewshot": 0, "decontamination_ngram": 13, "excluded": 3,
           "dataset": "EleutherAI/lambada_openai", "dataset_split": "test"}
EVAL = {"bits_per_byte": 3.5, "perplexity": 20.0, "harness": {"marin_cloze": CLOZE, "lambada_openai": LAMBADA}}


def _cells(lines: list[str], task: str, metric: str) -> list[str]:
    [line] = [x for x in lines if x.startswith(f"| `{task}` | {metric} |")]
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.parametrize(("task", "metric", "want"), [
    # chance, unigram, constant, model, stderr, mark, clean items, samples, shots
    ("marin_cloze", "acc", ["0.0000", "0.0000", "0.3000", "0.2500", "0.0500", f"**{bl.SAME}**",
                            "0.2632 (2 contaminated)", "40 of 40", "0"]),
    ("lambada_openai", "acc", ["–", "0.0000", "0.1250", "0.5000", "0.1000", bl.BETTER, "only these (3 excluded)",
                               "8 of 20 (limit 8)", "0"]),
    ("lambada_openai", "perplexity", ["–", "2000.0000", "n/a", "900.0000", "100.0000", bl.BETTER,
                                      "only these (3 excluded)", "8 of 20 (limit 8)", "0"]),
])
def test_the_benchmarks_table_shows_baselines_stderr_mark_and_clean_items(task: str, metric: str,
                                                                          want: list[str]) -> None:
    lines = benchmarks.table(benchmarks.rows(EVAL), benchmarks.plain, "metrics/eval.json")
    assert lines[0] == benchmarks.HEADING and "(metrics/eval.json)" in lines[2]
    assert "| clean items |" in lines[4]  # evaluate had decontaminate's findings
    assert _cells(lines, task, metric)[2:] == want


def test_the_report_and_the_export_render_one_table_from_the_same_numbers() -> None:
    rows = benchmarks.rows(EVAL)
    facts: dict[str, Any] = {}

    def fid(x: Any) -> str | None:  # a row of fact ids, as marin.report.harness_section builds it
        if x is None:
            return None
        facts[f"F{len(facts)}"] = x
        return f"F{len(facts) - 1}"

    cited = [{k: v if k in ("task", "metric") else fid(v) for k, v in r.items()} for r in rows]

    def link(f: str | None) -> str:
        return "not recorded" if f is None else f"[{benchmarks.plain(facts[f])}](#{f})"

    ours = benchmarks.table(rows, benchmarks.plain, "x")
    theirs = benchmarks.table(cited, link, "x")
    assert [re.sub(r"\[([^]]*)\]\(#F\d+\)", r"\1", line) for line in theirs] == ours  # links aside, the same
    assert "[0.2632](#F" in "\n".join(theirs)  # the report's cells are links to their facts
    assert benchmarks.table([], benchmarks.plain, "x") == []  # no harness task: no section


def test_a_registry_tasks_model_index_entry_names_its_hub_dataset_and_split() -> None:
    meta = {"model_name": "m", "license": "Apache-2.0", "language": ["en"]}
    model = {"n_params": 10, "step": 3, "tensor_digest": "sha256:" + "0" * 64, "model": {"max_seq_len": 32}}
    text = card.hub_card(meta, [{"name": "kjv", "license": "MIT"}], model, EVAL, card.Sample("ROMEO.", 5), "models/hf")
    _, results = model_index_to_eval_results(ModelCard(text).data.to_dict()["model-index"])
    got = {(r.task_name, r.metric_type): (r.dataset_type, r.dataset_split) for r in results
           if r.task_name != "Causal language modeling"}
    assert got == {("lambada_openai", "acc"): ("EleutherAI/lambada_openai", "test"),
                   ("lambada_openai", "perplexity"): ("EleutherAI/lambada_openai", "test"),
                   ("marin_cloze", "acc"): ("marin_cloze", "validation")}  # built in: cut from the validation split
    assert f"\n{benchmarks.HEADING}\n" in text and "| `marin_cloze` | acc |" in text  # the card that is uploaded


INSTRUCT = {"base": {"exact_match": 0.0, "containment": 0.0, "choice_acc": 0.273, "token_acc": 0.105, "examples": 40,
                     "by_task": {"arith": {"exact_match": 0.0, "containment": 0.0, "choice_acc": 0.3,
                                           "token_acc": 0.1, "examples": 40}}},
            "instruct": {"exact_match": 0.0, "containment": 0.0, "choice_acc": 0.287, "token_acc": 0.323,
                         "examples": 40, "by_task": {"arith": {"exact_match": 0.0, "containment": 0.0,
                                                               "choice_acc": 0.35, "token_acc": 0.3, "examples": 40}}}}


@pytest.mark.parametrize(("moved", "order"), [
    ({}, ["choice_acc", "token_acc", "containment", "exact_match"]),  # exact match 0 for both: last
    ({"exact_match": 0.05}, ["choice_acc", "token_acc", "exact_match", "containment"]),  # it moved, containment not
])
def test_the_instruct_card_carries_every_metric_the_ones_that_move_first(moved: dict[str, float],
                                                                       order: list[str]) -> None:
    ev = {**INSTRUCT, "instruct": {**INSTRUCT["instruct"], **moved}}
    assert instruct_card.shown(ev) == order
    got = [(r.dataset_config, r.metric_type, r.metric_value) for r in instruct_card.results(ev)]
    scores = {"all": ev["instruct"], **ev["instruct"]["by_task"]}
    assert got == [(t, m, scores[t][m]) for t in scores for m in order]
    text = "\n".join(instruct_card._evaluation(ev))
    rows = [x for x in text.splitlines() if x.startswith("| all |")]
    assert [r.split("|")[3].strip() for r in rows] == [instruct_card.METRICS[m] for m in order]
    assert "| all | 40 | token accuracy | 0.3230 | 0.1050 |" in text
    assert ("Containment is 0 for both models" in text) == ("exact_match" in moved)


def test_the_generation_config_sets_no_max_length() -> None:
    # transformers warns on every generate(..., max_new_tokens=...) when the file sets max_length too
    assert "max_length" not in hf.generation_config(0, [0, 1])
