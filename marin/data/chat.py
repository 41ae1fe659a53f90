"""The chat format: four reserved special tokens and one Jinja chat template in the Hugging Face
convention (``tokenizer.apply_chat_template``), stored with the tokenizer.

A conversation renders as ``{eos}<|user|>question<|end|><|assistant|>answer<|end|>``: the
end-of-text token first, as every pretraining document is read (marin.data.documents), then
each message between its role token and ``<|end|>``; ``add_generation_prompt`` appends
``<|assistant|>``. The special tokens split the text before byte-level BPE sees it, so a
message's content encodes the same wherever it stands, and the ids marin trains on are the ids
transformers gets from the same template and tokenizer (tests/test_instruct.py checks this).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

ROLES = ("system", "user", "assistant")
END = "<|end|>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", END)
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE = (
    "{{ eos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

Messages = Sequence[dict[str, str]]


@functools.lru_cache(maxsize=1)
def _template() -> Any:
    # as transformers compiles it: a sandboxed environment, trim_blocks and lstrip_blocks
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(TEMPLATE)


def render(messages: Messages, eos: str, add_generation_prompt: bool = False) -> str:
    """The template's text for ``messages``."""
    return _template().render(messages=list(messages), eos_token=eos, add_generation_prompt=add_generation_prompt)


def encode(tok: Any, messages: Messages, eos: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32, mask bool) of a conversation: the mask marks the tokens of every assistant
    message and its ``<|end|>``, the tokens a fine-tune learns to predict."""
    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    full = ids(render(messages, eos))
    mask = np.zeros(len(full), dtype=bool)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = len(ids(render(messages[:i], eos, True))), len(ids(render(messages[: i + 1], eos)))
        mask[start:end] = True
    return np.array(full, dtype=np.int32), mask


def prompt_ids(tok: Any, messages: Messages, eos: str) -> np.ndarray:
    """The ids a model answers from: the conversation so far and ``<|assistant|>``."""
    return np.array(tok.encode(render(messages, eos, True), add_special_tokens=False).ids, dtype=np.int32)
