"""Greedy decoding from a model's logits function: the evaluate stage's samples and the MLflow pyfunc
model (:mod:`marin.tracking.generator_model`) generate the same tokens."""

from __future__ import annotations

from typing import Any

import numpy as np


def greedy(logits_fn: Any, params: Any, prompt_ids: list[int], eos_id: int, seq_len: int, n: int) -> list[int]:
    """Greedy continuation; a fixed (1, seq_len) buffer so one compiled function serves
    every length (causal attention: padding on the right changes nothing before it)."""
    ids = [eos_id, *prompt_ids][-seq_len:]
    out: list[int] = []
    for _ in range(n):
        window = (ids + out)[-seq_len:]
        buf = np.full((1, seq_len), eos_id, dtype=np.int32)
        buf[0, : len(window)] = window
        logits = np.asarray(logits_fn(params, buf))  # (1, T, V)
        out.append(int(logits[0, len(window) - 1].argmax()))
    return out
