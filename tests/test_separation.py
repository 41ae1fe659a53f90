"""The built-in benchmarks mean something: on every harness task, the shipped model and a model
trained for 40 steps (the shipped params, ``train.steps: 40``, the same code path from there) are
more than two stderr apart: each one's value lies outside the other's
two-stderr band (the report's mark, applied with the other model as the baseline). A task that
cannot tell them apart is no evidence of training, and the report would claim more than it measures.
The same holds for the instruction tasks: the shipped instruct model and the one fine-tuned the
same way from the 40-step base, by token accuracy on the held-out instructions, each task also
beyond two stderr above its constant answer."""

from __future__ import annotations

import json

import pytest

from .conftest import Project, copy_project, evaluation

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def early(_shipped: tuple[Project, str], tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = copy_project(_shipped[0], tmp_path_factory.mktemp("early") / "proj")
    params = proj.params
    params["train"]["steps"], params["train"]["warmup_steps"] = 40, 4
    proj.write_params(params)
    proj.dvc("repro", "evaluate", "evaluate_instruct", timeout=1800)
    return proj


def _apart(a: float, se_a: float, b: float, se_b: float) -> bool:
    """``a`` above ``b`` by more than two of either's stderr."""
    return a - b > 2 * max(se_a, se_b)


def test_every_harness_task_separates_the_shipped_model_from_a_40_step_one(_shipped: tuple[Project, str],
                                                                            early: Project) -> None:
    ours, theirs = evaluation(_shipped[0].root)["harness"], evaluation(early.root)["harness"]
    assert set(ours) == set(theirs) == set(_shipped[0].params["evaluate"]["harness"]["tasks"])
    for task, v in ours.items():
        w = theirs[task]
        for metric in [m for m in v if f"{m}_stderr" in v]:
            print(f"{task} {metric}: shipped {v[metric]:.4f} ± {v[f'{metric}_stderr']:.4f}, "
                  f"40 steps {w[metric]:.4f} ± {w[f'{metric}_stderr']:.4f}")
            sign = 1 if v[f"better/{metric}"] == "higher" else -1
            assert _apart(sign * v[metric], v[f"{metric}_stderr"], sign * w[metric], w[f"{metric}_stderr"]), \
                (task, metric)


def _instruct_values(proj: Project) -> tuple[dict, dict]:
    """The latest evaluate_instruct run's values: the instruct model's and the constant answer's."""
    evals = {r["body"]["name"]: r["body"]["values"] for r in proj.runs("evaluate_instruct")[-1] if r["kind"] == "eval"}
    return evals["instruct_instructions"], evals["constant_answer_instructions"]


def test_every_instruction_task_separates_the_shipped_instruct_model_from_a_40_step_one(
        _shipped: tuple[Project, str], early: Project) -> None:
    (ours, constant), (theirs, _) = _instruct_values(_shipped[0]), _instruct_values(early)
    tasks = _shipped[0].params["instructions"]["tasks"]
    assert {k.split("/")[0] for k in ours if "/" in k} == set(tasks)
    for task in tasks:
        v, se = ours[f"{task}/token_acc"]["value"], ours[f"{task}/token_acc_stderr"]["value"]
        w, se_w = theirs[f"{task}/token_acc"]["value"], theirs[f"{task}/token_acc_stderr"]["value"]
        c = constant[f"{task}/token_acc"]["value"]
        print(f"{task} token_acc: shipped {v:.4f} ± {se:.4f}, 40 steps {w:.4f} ± {se_w:.4f}, constant answer {c:.4f}")
        assert _apart(v, se, w, se_w), task
        assert _apart(v, se, c, 0.0), task


def test_held_out_answers_take_turns(_shipped: tuple[Project, str]) -> None:
    """The held-out set is balanced where the data allows: within each task, the answers take turns
    (the first examples of a task are all its different answers before any repeats), so the corpus
    task offers every corpus the validation split has; and the next-word task's right answer is in
    no one position."""
    heldout = [json.loads(x) for x in (_shipped[0].root / "data/instructions/heldout.jsonl").read_text().splitlines()]
    for task in sorted({e["task"] for e in heldout}):
        refs = [e["messages"][-1]["content"] for e in heldout if e["task"] == task]
        kinds = len(set(refs))
        assert len(set(refs[:kinds])) == kinds, (task, refs[:kinds])
    items = [json.loads(x) for x in (_shipped[0].root / "data/evalsets/next_word.jsonl").read_text().splitlines()]
    golds = [it["gold"] for it in items]
    assert max(golds.count(g) for g in range(4)) / len(golds) < 0.35
