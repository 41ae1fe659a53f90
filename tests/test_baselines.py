"""What a benchmark number is measured against (marin/evaluate/baselines.py) and how the per-sample
files are compared (marin/evaluate/harness_files.py), on hand-made lm-eval sample logs."""

from __future__ import annotations

import json

import pytest

from marin.evaluate import baselines as bl
from marin.evaluate import harness_files as hf


def mc(gold: int, choices: list[str]) -> dict:
    return {"target": gold, "arguments": [["passage\nThis passage is from", " " + c] for c in choices]}


def test_constant_answer_of_multiple_choice_is_the_best_text_or_position() -> None:
    # "Genesis" is the answer 3 times of 5, at three different positions: the text wins over any position
    samples = [mc(0, ["Genesis", "Hamlet", "Job", "Lear"]), mc(1, ["Job", "Genesis", "Lear", "Ruth"]),
               mc(2, ["Ruth", "Job", "Genesis", "Lear"]), mc(0, ["Lear", "Job", "Ruth", "Genesis"]),
               mc(0, ["Hamlet", "Lear", "Ruth", "Job"])]
    assert bl.constant_answer("multiple_choice", samples) == pytest.approx(3 / 5)
    # every gold at position 3, every text different: the position wins
    by_position = [mc(3, [f"a{i}", f"b{i}", f"c{i}", f"d{i}"]) for i in range(4)] + [mc(0, ["x", "y", "z", "w"])]
    assert bl.constant_answer("multiple_choice", by_position) == pytest.approx(4 / 5)
    assert bl.computed_chance("multiple_choice", samples) == pytest.approx(0.25)
    assert bl.computed_chance("loglikelihood", samples) is None


def test_constant_answer_of_a_cloze_is_the_most_frequent_target() -> None:
    samples = [{"target": f" {w}"} for w in ("lord", "king", "lord", "queen", "lord ", "crown")]
    assert bl.constant_answer("loglikelihood", samples) == pytest.approx(3 / 6)
    assert bl.constant_answer("loglikelihood", []) is None


@pytest.mark.parametrize(("value", "stderr", "better", "base", "expected"), [
    (0.185, 0.028, "higher", [0.25, 0.215, 0.30], bl.WORSE),   # 0.3 - 0.185 > 2 x 0.028
    (0.26, 0.028, "higher", [0.25, 0.215], bl.SAME),           # within 2 stderr of chance
    (0.40, 0.028, "higher", [0.25, 0.215], bl.BETTER),
    (0.25 + 0.056, 0.028, "higher", [0.25], bl.SAME),            # exactly 2 stderr: not beyond
    (90.0, 5.0, "lower", [120.0, 95.0], bl.SAME),              # perplexity: the best baseline is the lowest
    (80.0, 5.0, "lower", [120.0, 95.0], bl.BETTER),
    (0.5, None, "higher", [0.25], None), (0.5, 0.1, "higher", [], None)])
def test_mark_against_the_best_baseline(value, stderr, better, base, expected) -> None:
    assert bl.mark(value, stderr, better, base) == expected
    if expected is not None:
        assert bl.mark_of([value, stderr, better, *base]) == expected


def test_mean_stderr_is_lm_evals() -> None:
    from lm_eval.api.metrics import mean_stderr

    xs = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert bl.mean_stderr(xs) == pytest.approx(mean_stderr(xs), rel=1e-12)


def test_note_states_samples_of_items_the_limit_and_the_mark() -> None:
    assert bl.note(0.028, 200, 400, 200, bl.SAME) == ", ± 0.0280, 200 of 400 samples (limit 200); " + bl.SAME
    assert bl.note(None, 400, 400, None, bl.BETTER) == ", 400 of 400 samples"


def test_first_difference_names_the_task_and_document() -> None:
    rows = [{"task": "t1", "doc_id": i, "resps": [[[-1.5, False]]], "acc": 0.0} for i in range(3)]
    a = [(json.dumps(r) + "\n").encode() for r in rows]
    b = list(a)
    b[2] = (json.dumps({**rows[2], "acc": 1.0}) + "\n").encode()
    assert hf.first_difference(a, a) is None
    assert hf.first_difference(a, b) == "line 3: task t1 doc 2: acc differ"
    assert hf.first_difference(a, a[:2]) == "line 3: task t1 doc 2: in one file only, or not a JSON object"
