"""The held-out instructions scored token by token: a measure of how well the model knows each
answer, which moves long before the whole answer comes out right.

``token_acc`` is, per example, the fraction of the reference answer's tokens (and its ``<|end|>``,
as the fine-tune is trained) that the model predicts as its most likely next token, each given the
chat prompt and the reference's tokens before it (teacher forcing, one forward pass per example).
A task's value is the mean over its examples; its stderr, lm-eval's mean_stderr over them.

Its constant answer is the best a model that ignores the question can do: one token sequence given
to every example, at each position the token that scores most there over the task's references
(each reference weighted by 1 / its length, so the sequence is the best one in hindsight).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BATCH = 32  # examples per forward pass: (BATCH, seq_len, vocab) logits


def answer_ids(tok: Tokenizer, examples: Sequence[dict[str, Any]], eos: str) -> list[tuple[list[int], list[int]]]:
    """Per example, (prompt ids through ``<|assistant|>``, the reference's ids and ``<|end|>``)."""
    from marin.data import chat

    end = chat.special_id(tok, chat.END)
    return [([int(i) for i in chat.prompt_ids(tok, e["messages"][:-1], eos)],
             [*chat.text_ids(tok, e["messages"][-1]["content"]), end]) for e in examples]


def hits(logits_fn: Any, params: Any, pairs: list[tuple[list[int], list[int]]], pad_id: int,
         seq_len: int) -> list[float]:
    """Per (prompt, answer) pair, the fraction of the answer's tokens that are the argmax of the
    logits before them; each row is its last ``seq_len`` tokens, right-padded (causal attention:
    padding changes nothing before it). An answer longer than the window counts its first tokens,
    which the window cannot hold, as misses."""
    out: list[float] = []
    for i in range(0, len(pairs), BATCH):
        batch = pairs[i:i + BATCH]
        buf = np.full((len(batch), seq_len), pad_id, dtype=np.int32)
        for j, (p, a) in enumerate(batch):
            w = (p + a)[-seq_len:]
            buf[j, : len(w)] = w
        best = np.asarray(logits_fn(params, buf)).argmax(-1)
        for j, (p, a) in enumerate(batch):
            n = min(len(p) + len(a), seq_len)
            seen = min(len(a), n - 1)  # answer tokens with a token before them in the window
            right = int((best[j, n - seen - 1:n - 1] == buf[j, n - seen:n]).sum())
            out.append(right / len(a))
    return out


def constant(answers: Sequence[Sequence[int]]) -> tuple[float, list[int]]:
    """The best constant token sequence's mean token accuracy over ``answers`` (see the module), and
    the sequence (ties: the smallest id)."""
    weight: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for a in answers:
        for pos, t in enumerate(a):
            weight[pos][t] += 1 / len(a)
    best = [min(w.items(), key=lambda kv: (-kv[1], kv[0])) for _, w in sorted(weight.items())]
    return sum(x for _, x in best) / len(answers), [t for t, _ in best]
