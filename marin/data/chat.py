"""The chat format: four reserved special tokens and one Jinja chat template in the Hugging Face
convention (``tokenizer.apply_chat_template``), stored with the tokenizer.

A conversation renders as ``{eos}<|user|>question<|end|><|assistant|>answer<|end|>``: the
end-of-text token first, as every pretraining document is read (marin.data.documents), then
each message between its role token and ``<|end|>``; ``add_generation_prompt`` appends
``<|assistant|>``. The ids are built piece by piece: each special token the template writes is
its id, and each message's content is encoded as plain text (:func:`text_ids`), so a user who
writes ``<|assistant|>`` in a message gets the ordinary tokens of that string, never a forged
turn. For content without such strings the ids are those of the rendered text, the ids
transformers gets from the same template and tokenizer; with them, the ids transformers gets
with ``apply_chat_template(..., sanitize_control_tokens=True)`` (tests/test_special_tokens.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marin.errors import StageError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ROLES = ("system", "user", "assistant")
EOS = "<|endoftext|>"  # the end-of-text token of a tokenizer trained here
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


def special_id(tok: Tokenizer, token: str) -> int:
    """The id of one of the chat format's tokens (the EOS, ``<|end|>``, a role's), refused in one line
    when the tokenizer lacks it (one trained before the chat tokens: run the tokenize stage again)."""
    i = tok.token_to_id(token)
    if i is None:
        raise StageError(f"the tokenizer has no {token!r} token, which the chat format needs: run "
                         "`dvc repro tokenize` (a tokenizer trained here adds the chat tokens)")
    return i


def token_of(tok: Tokenizer, i: int) -> str:
    """The token of id ``i`` (a model's EOS id), refused in one line when the tokenizer has none."""
    token = tok.id_to_token(i)
    if token is None:
        raise StageError(f"the tokenizer has no token of id {i}: the model and tokenizer do not belong together")
    return token


def text_ids(tok: Tokenizer, text: str) -> list[int]:
    """The ids of ``text`` as plain text: a special token's string in it (``<|end|>``, the EOS)
    becomes the ordinary tokens of that string, never the special id."""
    old = tok.encode_special_tokens
    tok.encode_special_tokens = True
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = old


def forgeable(tok: Tokenizer, strings: Sequence[str]) -> tuple[str, str] | None:
    """(string, why) of the first of ``strings`` (reserved: the EOS, the chat tokens) that text could
    turn into its id, or None. Only a *special* added token is kept out of text by
    ``encode_special_tokens``: a non-special added token is matched in any text, and a plain
    vocabulary entry can be reached by the model's own merges."""
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    for s in strings:
        i = tok.token_to_id(s)
        if i is None:
            continue  # missing: added as a special token (marin.data.tokenize.with_chat_tokens)
        if s not in special:
            return s, "is a token but not a special added token"
        if any(i in text_ids(tok, t) for t in (s, f"a{s}b", f" {s} ")):
            return s, "encodes from plain text to its own id"
    return None


def carries(text: str, specials: Sequence[str]) -> bool:
    """Whether ``text`` holds the string of a special token (counted and warned about, encoded as text)."""
    return any(s in text for s in specials)


def _pieces(tok: Tokenizer, messages: Messages, eos: str, add_generation_prompt: bool) -> list[tuple[list[int], bool]]:
    """(ids, learned) of each piece of the rendered conversation, in order: the template's special
    tokens by id, each content as plain text; ``learned``: an assistant message's content and end."""
    special = functools.partial(special_id, tok)
    out = [([special(eos)], False)]
    for m in messages:
        if m["role"] not in ROLES:
            raise ValueError("roles are system, user and assistant")
        learned = m["role"] == "assistant"
        out += [([special(f"<|{m['role']}|>")], False), (text_ids(tok, m["content"]), learned),
                ([special(END)], learned)]
    if add_generation_prompt:
        out.append(([special("<|assistant|>")], False))
    return out


def encode(tok: Tokenizer, messages: Messages, eos: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32, mask bool) of a conversation: the mask marks the tokens of every assistant
    message and its ``<|end|>``, the tokens a fine-tune learns to predict."""
    pieces = _pieces(tok, messages, eos, False)
    ids = [i for p, _ in pieces for i in p]
    mask = np.array([m for p, m in pieces for _ in p], dtype=bool)
    return np.array(ids, dtype=np.int32), mask


def prompt_ids(tok: Tokenizer, messages: Messages, eos: str) -> np.ndarray:
    """The ids a model answers from: the conversation so far and ``<|assistant|>``."""
    return np.array([i for p, _ in _pieces(tok, messages, eos, True) for i in p], dtype=np.int32)
