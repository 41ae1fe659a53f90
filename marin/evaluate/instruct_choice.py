"""The held-out instructions as multiple choice: a measure that moves before exact match does.

A tiny model rarely writes a whole reference answer (exact match stays at 0 on most tasks), so
each example is also scored the way lm-eval scores a multiple-choice task: its reference answer
among up to ``CHOICES - 1`` other answers of the same task (other held-out references, drawn by a
keyed digest), each scored as the fine-tune is trained, by the sum of the log-probabilities of the
answer's tokens and its ``<|end|>`` after the chat prompt. ``choice_acc`` is 1 where the reference
scores strictly above every other answer (a tie counts against it). Chance is the mean of 1 / the
number of choices; the constant answer, the share of the task's most frequent reference (an
answer given to every example wins exactly there).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CHOICES = 4


def _key(example_key: str, answer: str) -> str:
    return hashlib.sha256(f"{example_key}\0{answer}".encode()).hexdigest()


def options(examples: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Per example, its reference answer first, then up to ``CHOICES - 1`` other distinct
    references of its task, those with the smallest keys."""
    answers: dict[str, set[str]] = defaultdict(set)
    for e in examples:
        answers[e["task"]].add(e["messages"][-1]["content"])
    out = []
    for e in examples:
        gold = e["messages"][-1]["content"]
        others = sorted((a for a in answers[e["task"]] if a != gold), key=lambda a, k=e["key"]: _key(k, a))
        out.append([gold, *others[:CHOICES - 1]])
    return out


def requests(tok: Tokenizer, examples: Sequence[dict[str, Any]], choices: list[list[str]],
             eos: str) -> list[tuple[None, list[int], list[int]]]:
    """lm-eval's (context ids, continuation ids) of every (example, choice), in order: the prompt
    through ``<|assistant|>``, then the answer and ``<|end|>``."""
    from marin.data import chat

    end = chat.special_id(tok, chat.END)
    out: list[tuple[None, list[int], list[int]]] = []
    for e, cs in zip(examples, choices, strict=True):
        prompt = [int(i) for i in chat.prompt_ids(tok, e["messages"][:-1], eos)]
        out += [(None, prompt, [*chat.text_ids(tok, c), end]) for c in cs]
    return out


def correct(choices: list[list[str]], logliks: Sequence[float]) -> list[bool]:
    """Per example, whether its reference (first) scores strictly above each other choice."""
    out, at = [], 0
    for cs in choices:
        lls = logliks[at:at + len(cs)]
        out.append(len(cs) > 1 and all(lls[0] > x for x in lls[1:]))
        at += len(cs)
    return out


def chance(choices: list[list[str]]) -> float:
    return sum(1 / len(cs) for cs in choices) / len(choices)


def constant(examples: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """The best constant answer's choice accuracy (the share of its most frequent reference), and it."""
    refs = Counter(e["messages"][-1]["content"] for e in examples)
    answer, n = min(refs.items(), key=lambda kv: (-kv[1], kv[0]))
    return n / len(examples), answer
