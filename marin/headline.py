"""Which evaluation values are measurements of the model and which one is a task's headline: the rule the
DVC metrics files (:mod:`marin.evaluate.metrics_file`) and the MLflow pipeline runs (:mod:`marin.tracking`)
share. Here, below both, so that the stages that sync to MLflow do not depend on the evaluate package."""

from __future__ import annotations

from typing import Any

BASELINES = ("chance/", "constant/", "unigram/", "unigram_")  # a task's or the data's own levels
SETTINGS = ("limit",)  # lm-eval's limit may be a float (a fraction of the items)
INSTRUCTION_SCORES = ("token_acc", "choice_acc")  # of each model: graded per token, and by the best choice


def is_measurement(key: str, value: object) -> bool:
    """A float that measures the model: not a baseline, a setting or a count."""
    return isinstance(value, float) and not key.startswith(BASELINES) and key not in SETTINGS


def task_headline(values: dict[str, Any]) -> str | None:
    """A harness task's headline metric: its accuracy (lm-eval's ``acc``) where it has one, else the
    first of its metrics by name (no stderr, baseline or decontaminated variant)."""
    if "acc" in values:
        return "acc"
    names = sorted(k for k, v in values.items() if is_measurement(k, v) and "/" not in k and "stderr" not in k)
    return names[0] if names else None
