"""What the stages print for a reader at the terminal (issue 57, Terminal and CLI): a baseline with no
meaning is ``n/a`` with its reason, the instruction scores are one summary line per task, and tokens per
parameter comes with its reference. Pure formatting functions on hand-made values."""

from __future__ import annotations

import pytest

from marin.evaluate import baselines as bl
from marin.evaluate.evaluate_instruct_stage import task_lines
from marin.evaluate.harness_run import terminal_line
from marin.train.budget import Budget


@pytest.mark.parametrize(("metric", "known", "output_type", "expected"), [
    # a cloze (open vocabulary): chance 0 and the unigram's greedy hit rate mean nothing; its perplexity does
    ("acc", {"chance": 0.0, "unigram": 0.0, "constant answer": 0.03}, "loglikelihood",
     ["chance n/a: open vocabulary", "unigram n/a: the same answer to every item", "constant answer 0.0300"]),
    ("perplexity", {"unigram": 812.5}, "loglikelihood", ["unigram 812.5000"]),
    ("exact_match", {"unigram": 0.0, "constant answer": 0.1}, "generate_until",
     ["unigram n/a: the same answer to every item", "constant answer 0.1000"]),
    # multiple choice: every baseline has a meaning, a unigram of 0 included
    ("acc", {"chance": 0.25, "unigram": 0.0, "constant answer": 0.3}, "multiple_choice",
     ["chance 0.2500", "unigram 0.0000", "constant answer 0.3000"]),
    ("acc", {"chance": 0.25, "unigram": 0.21}, "", ["chance 0.2500", "unigram 0.2100"]),  # type unknown: as recorded
    ("acc", {}, "loglikelihood", []),
])
def test_a_baseline_without_meaning_is_na_with_its_reason(metric, known, output_type, expected) -> None:
    assert bl.shown(metric, known, output_type) == expected


def test_a_cloze_line_shows_na_and_keeps_the_mark_of_every_recorded_baseline() -> None:
    vals = {"acc": 0.02, "acc_stderr": 0.01, "chance/acc": 0.0, "constant/acc": 0.09, "better/acc": "higher",
            "perplexity": 900.0, "better/perplexity": "lower", "samples": 100, "items": 400, "limit": 100,
            "num_fewshot": 0}
    line = terminal_line("marin_cloze", vals, {"acc": 0.0, "perplexity": 1200.0}, "loglikelihood")
    assert line == ("evaluate: harness marin_cloze: acc 0.0200 ± 0.0100 (chance n/a: open vocabulary, unigram n/a: "
                    "the same answer to every item, constant answer 0.0900): worse than baseline; perplexity "
                    "900.0000 (unigram 1200.0000) (100 of 400 samples, limit 100, 0-shot)")
    assert "chance 0.0000" not in line and "unigram 0.0000" not in line


def _exact(x: float) -> dict[str, float | str]:
    return {"value": x, "hex": x.hex()}


def _model(task_scores: dict[str, dict[str, tuple[float, float]]]) -> dict[str, object]:
    """A model's recorded values by task: score -> (value, stderr), 40 examples each."""
    out: dict[str, object] = {}
    for task, scores in task_scores.items():
        for key, (v, se) in scores.items():
            out[f"{task}/{key}"], out[f"{task}/{key}_stderr"] = _exact(v), _exact(se)
        out[f"{task}/examples"] = 40
    return out


ZERO = (0.0, 0.0)  # exact match and containment of a tiny model: 0, no spread
CONSTANT = {f"{t}/{k}": _exact(v) for t in ("arith", "recall") for k, v in (
    ("exact_match", 0.05), ("containment", 0.05), ("choice_acc", 0.30), ("choice_chance", 0.25), ("token_acc", 0.08))}


@pytest.mark.parametrize(("base", "instruct", "expected"), [
    ({"exact_match": ZERO, "containment": ZERO, "choice_acc": (0.273, 0.07), "token_acc": (0.105, 0.01)},
     {"exact_match": ZERO, "containment": ZERO, "choice_acc": (0.287, 0.07), "token_acc": (0.323, 0.02)},
     "evaluate_instruct: arith, 40 examples, base → instruct (constant answer): exact match 0.000 → 0.000 (0.050), "
     "containment 0.000 → 0.000 (0.050), choice acc 0.273 → 0.287 (0.300), token acc 0.105 → 0.323 (0.080); "
     "worse than baseline: exact match, containment; not distinguishable from baseline: choice acc"),
    # the models differ in a mark: the one it belongs to is named; a score better than baseline for both is unmarked
    ({"exact_match": ZERO, "containment": ZERO, "choice_acc": (0.30, 0.07), "token_acc": (0.09, 0.01)},
     {"exact_match": (0.5, 0.05), "containment": (0.6, 0.05), "choice_acc": (0.9, 0.03), "token_acc": (0.7, 0.02)},
     "evaluate_instruct: arith, 40 examples, base → instruct (constant answer): exact match 0.000 → 0.500 (0.050), "
     "containment 0.000 → 0.600 (0.050), choice acc 0.300 → 0.900 (0.300), token acc 0.090 → 0.700 (0.080); "
     "worse than baseline: exact match (base), containment (base); not distinguishable from baseline: "
     "choice acc (base), token acc (base)"),
])
def test_instruction_scores_are_one_summary_line_per_task(base, instruct, expected) -> None:
    other = {"exact_match": ZERO, "containment": ZERO, "choice_acc": (0.5, 0.05), "token_acc": (0.5, 0.01)}
    by_model = {"base": _model({"arith": base, "recall": other}), "instruct": _model({"arith": instruct,
                                                                                      "recall": other})}
    lines = task_lines(by_model, CONSTANT)
    assert len(lines) == 2 and lines[0] == expected  # one per task, both models in it
    assert lines[1].startswith("evaluate_instruct: recall, 40 examples, base → instruct (constant answer): ")
    assert lines[1].endswith("; worse than baseline: exact match, containment")
    assert all(line.count("worse than baseline") <= 1 for line in lines)


@pytest.mark.parametrize(("budget", "expected"), [
    (Budget(400 * 32 * 128, 18_170, 1_000_000), "1.64 tokens per parameter (Chinchilla compute-optimal: ~20, "
                                                "Hoffmann et al. 2022)"),
    (Budget(20_000_000, 5_000_000, 1_000_000), "20 tokens per parameter (Chinchilla compute-optimal: ~20, "
                                               "Hoffmann et al. 2022)"),
])
def test_tokens_per_parameter_is_printed_with_its_reference(budget: Budget, expected: str) -> None:
    assert budget.line().endswith(f", {expected}")
