"""The chat format (marin.data.chat): the template's text, the ids and the assistant mask, and the
chat tokens a tokenizer gets. Pure pieces: no stage runs here."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from marin.config import TokenizeParams
from marin.data import chat
from marin.data import tokenize as tk

CONVERSATION = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Name the book of: In the beginning God created"},
                {"role": "assistant", "content": "Genesis 1"},
                {"role": "user", "content": "And the next verse?"},
                {"role": "assistant", "content": "And the earth was without form"}]
TEXTS = ["In the beginning God created the heaven and the earth. " * 3,
         "ROMEO. But soft, what light through yonder window breaks? " * 3] * 10


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return tk.train_tokenizer(TEXTS, TokenizeParams(vocab_size=300, min_frequency=1, shard_max_tokens=1000))


def test_the_template_renders_each_message_between_its_role_and_end_token() -> None:
    text = chat.render(CONVERSATION[:2], "<|endoftext|>", add_generation_prompt=True)
    assert text == ("<|endoftext|><|system|>Answer briefly.<|end|>"
                    "<|user|>Name the book of: In the beginning God created<|end|><|assistant|>")
    assert chat.render(CONVERSATION[:2], "<|endoftext|>") == text.removesuffix("<|assistant|>")
    with pytest.raises(ValueError, match="roles are system, user and assistant"):
        chat.render([{"role": "narrator", "content": "x"}], "<|endoftext|>")


def test_a_trained_tokenizer_reserves_the_chat_tokens_as_single_special_ids(tok: Tokenizer) -> None:
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert specials == {tk.EOS, *chat.CHAT_TOKENS}
    for t in chat.CHAT_TOKENS:
        assert tok.encode(f"a{t}b", add_special_tokens=False).tokens.count(t) == 1
    assert tk.with_chat_tokens(tok) == []  # nothing to add


def test_the_mask_covers_exactly_the_assistant_messages_and_their_end_tokens(tok: Tokenizer) -> None:
    ids, mask = chat.encode(tok, CONVERSATION, tk.EOS)
    whole = tok.encode(chat.render(CONVERSATION, tk.EOS), add_special_tokens=False).ids
    assert ids.tolist() == whole  # segment boundaries do not change the encoding
    end = tok.token_to_id(chat.END)
    trained = ids[mask].tolist()
    spans, cur = [], []  # the masked runs, each an assistant message ending in <|end|>
    for i, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            cur.append(i)
        elif cur:
            spans.append(cur)
            cur = []
    spans += [cur] if cur else []
    assert [tok.decode(s[:-1]) for s in spans] == ["Genesis 1", "And the earth was without form"]
    assert all(s[-1] == end for s in spans) and len(trained) == sum(map(len, spans))
    prompt = chat.prompt_ids(tok, CONVERSATION[:2], tk.EOS)
    assert ids[: len(prompt)].tolist() == prompt.tolist() and not mask[: len(prompt)].any()


def test_a_pretrained_tokenizer_without_chat_tokens_gets_them_after_its_vocabulary() -> None:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(TEXTS, trainer=trainers.BpeTrainer(
        vocab_size=280, min_frequency=1, special_tokens=["</s>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    n, before = t.get_vocab_size(), t.encode(TEXTS[1]).ids
    assert tk.with_chat_tokens(t) == ["<|system|>", "<|user|>", "<|assistant|>"]  # <|end|> it had
    assert t.get_vocab_size() == n + 3 and sorted(t.token_to_id(x) for x in chat.CHAT_TOKENS[:3]) == [n, n + 1, n + 2]
    assert t.encode(TEXTS[1]).ids == before  # plain text encodes as before


def test_a_tokenizer_without_the_chat_tokens_is_refused_in_one_line_naming_the_token() -> None:
    """A tokenizer trained before the chat tokens existed: encoding a conversation names the missing
    token and the way out, instead of putting a None among the ids."""
    from marin.errors import StageError

    bare = Tokenizer(models.BPE(unk_token="[UNK]"))
    bare.pre_tokenizer, bare.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bare.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
    with pytest.raises(StageError, match=r"no '<\|system\|>' token.*dvc repro tokenize") as e:
        chat.encode(bare, CONVERSATION, "<|endoftext|>")
    assert "\n" not in str(e.value)
    assert chat.token_of(bare, 0) == "<|endoftext|>"
    with pytest.raises(StageError, match="no token of id 99999"):
        chat.token_of(bare, 99999)
