"""What a benchmark number is measured against: chance, the best constant answer (the majority
class) and the 2-stderr test of a result against the best baseline, and how each stderr is
computed. Pure Python over lm-eval's per-sample logs; the report, the card and the terminal all
use :func:`mark`, so the three say the same thing.

- Chance: the task's own statement (``metadata.chance`` in its YAML); for a multiple-choice task
  that states none, the mean over its samples of 1 / the number of choices.
- Constant answer: the best score of one answer given to every sample, chosen with the answers in
  hand (an upper bound on any constant answer): for a multiple-choice task, the same choice text
  (where a sample offers it) or the same position, whichever scores more; for a loglikelihood or
  generation task, the most frequent target. Defined for the 0/1 per-sample metrics averaged by
  ``mean`` (acc, acc_norm, exact_match); not for perplexity.
- The mark: a result that is not beyond 2 stderr better than the best baseline is "not
  distinguishable from baseline" (or "worse than baseline" when it is beyond 2 stderr worse).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

CONSTANT = ("acc", "acc_norm", "exact_match")  # 0/1 per sample, averaged: a constant answer has a score
BETTER, SAME, WORSE = "better than baseline", "not distinguishable from baseline", "worse than baseline"
# the formulas of the report's derived marks (marin.report.facts.FORMULAS): mark_of, mark_higher
MARK, MARK_HIGHER = "2-stderr mark against the best baseline", "2-stderr mark against the constant answer"
MEAN_STDERR = "sample standard deviation / sqrt(n) (lm-eval's mean_stderr)"


def stderr_method(aggregation: str, bootstrap_iters: int) -> str:
    """How lm-eval computed the stderr of a metric with this aggregation, in words."""
    if aggregation == "mean":
        return MEAN_STDERR
    return (f"bootstrap: {bootstrap_iters} resamples with replacement, in one process seeded 0 (lm-eval's own "
            "default is 100000 resamples in a process pool), stderr = their sample standard deviation")


def stated_aggregations(config: dict[str, Any]) -> dict[str, str]:
    """metric -> aggregation name, from a task config's ``metric_list`` (lm-eval's defaults otherwise)."""
    out = {"acc": "mean", "acc_norm": "mean", "exact_match": "mean", "perplexity": "perplexity",
           "word_perplexity": "weighted_perplexity", "byte_perplexity": "weighted_perplexity",
           "bits_per_byte": "bits_per_byte"}
    for m in config.get("metric_list") or []:
        if isinstance(m, dict) and isinstance(m.get("metric"), str) and isinstance(m.get("aggregation"), str):
            out[m["metric"]] = m["aggregation"]
    return out


def computed_chance(output_type: str, samples: list[dict[str, Any]]) -> float | None:
    """Chance of a multiple-choice task that states none: the mean of 1 / choices."""
    if output_type != "multiple_choice" or not samples:
        return None
    return sum(1 / max(len(s["arguments"]), 1) for s in samples) / len(samples)


def constant_answer(output_type: str, samples: list[dict[str, Any]]) -> float | None:
    """The best score of one constant answer over ``samples`` (lm-eval's logged samples)."""
    if not samples:
        return None
    n = len(samples)
    if output_type == "multiple_choice":
        texts, positions = Counter(), Counter()
        for s in samples:
            golds = s["target"] if isinstance(s["target"], list) else [s["target"]]
            choices = [a[1].strip() if isinstance(a, list | tuple) and len(a) > 1 else "" for a in s["arguments"]]
            texts.update({choices[g] for g in golds if isinstance(g, int) and 0 <= g < len(choices)})
            positions.update({g for g in golds if isinstance(g, int)})
        best = max([*texts.values(), *positions.values(), 0])
        return best / n
    targets = Counter(str(s["target"]).strip() for s in samples)
    return targets.most_common(1)[0][1] / n


def mark(value: float, stderr: float | None, better: str, baselines: list[float]) -> str | None:
    """Where ``value`` stands against the best of ``baselines`` (``better``: "higher" or "lower"):
    :data:`BETTER` beyond 2 stderr, :data:`WORSE` beyond 2 stderr, else :data:`SAME`. None when
    there is no stderr or no baseline to compare with."""
    if stderr is None or not baselines:
        return None
    sign = 1.0 if better == "higher" else -1.0
    best = max(sign * b for b in baselines)
    gap = sign * value - best
    return BETTER if gap > 2 * stderr else WORSE if gap < -2 * stderr else SAME


# Recorded baselines that mean nothing to a reader, shown as n/a with the reason: a chance of 0 (an open
# vocabulary has no choices to guess among), and the unigram model's 0/1 score where a task is not multiple
# choice (its greedy answer ignores the context: one answer to every item, which the constant answer bounds)
NO_CHANCE, NO_UNIGRAM = "n/a: open vocabulary", "n/a: the same answer to every item"


def shown(metric: str, known: Mapping[str, float], output_type: str) -> list[str]:
    """The ``known`` baselines of ``metric`` (name -> value) as the terminal prints them: ``n/a`` with
    the reason where one has no meaning (``output_type``: the task's, in lm-eval's words)."""
    out = []
    for name, v in known.items():
        if name == "chance" and v == 0:
            out.append(f"chance {NO_CHANCE}")
        elif name == "unigram" and metric in CONSTANT and output_type not in ("multiple_choice", ""):
            out.append(f"unigram {NO_UNIGRAM}")
        else:
            out.append(f"{name} {v:.4f}")
    return out


def mark_of(xs: list[Any]) -> str | None:
    """:func:`mark` of [value, stderr, better, *baselines] (a derived fact of the report)."""
    return mark(xs[0], xs[1], xs[2], list(xs[3:]))


def mark_higher(xs: list[Any]) -> str | None:
    """:func:`mark` of [value, stderr, *baselines], higher better (a derived fact of the report)."""
    return mark(xs[0], xs[1], "higher", list(xs[2:]))


def note(stderr: float | None, samples: int | None, items: int | None, limit: int | None,
         where: str | None) -> str:
    """What follows a result's shots in a card's metric name: its stderr, the samples scored out of
    the task's items (and the limit, where set), and its mark unless it is better than baseline."""
    out = f", ± {stderr:.4f}" if stderr is not None else ""
    if samples is not None:
        out += f", {samples} of {items} samples" if items is not None else f", {samples} samples"
        out += f" (limit {limit})" if limit is not None else ""
    return out + (f"; {where}" if where and where != BETTER else "")


def mean_stderr(xs: list[float]) -> float:
    """lm-eval's mean_stderr: the sample standard deviation over sqrt(n) (0 below 2 samples)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mu = sum(xs) / n
    return (sum((x - mu) ** 2 for x in xs) / (n - 1)) ** 0.5 / n ** 0.5
