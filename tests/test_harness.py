"""The lm-eval adapter's pure pieces on a tiny random model: every request type against a
straightforward one-sequence-at-a-time computation with the model itself."""

from __future__ import annotations

import functools
import random

import jax
import numpy as np
import pytest
from flax import nnx
from lm_eval.api.instance import Instance

from marin.config import TokenizeParams
from marin.data import tokenize as tk
from marin.evaluate import harness as hz
from marin.model.transformer import ModelConfig, Transformer

from .conftest import WORDS, make_text

SEQ = 32


@pytest.fixture(scope="module")
def lm() -> hz.MarinLM:
    rng = random.Random(3)
    tok = tk.train_tokenizer([make_text(rng, 30) for _ in range(20)], TokenizeParams(300, 2, 1000))
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64,
                      max_seq_len=SEQ)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return hz.MarinLM(graphdef, params, tok, tok.token_to_id(tk.SPECIAL_TOKENS[0]), SEQ, batch_size=4,
                      max_gen_toks=5)


def _logits(lm: hz.MarinLM, ids: list[int]) -> np.ndarray:
    """The model's float64 logits (len(ids), V) for one sequence, alone in a (1, SEQ) row padded on the
    right: no batching, sorting or buckets."""
    row = np.full((1, SEQ), lm.eos_id, dtype=np.int32)
    row[0, :len(ids)] = ids
    return np.asarray(_forward(lm.graphdef)(lm.params, row))[0, :len(ids)].astype(np.float64)


@functools.cache
def _forward(graphdef: nnx.GraphDef):
    return jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))


def _direct_logprobs(lm: hz.MarinLM, ids: list[int]) -> np.ndarray:
    """log p(ids[t+1] | ids[:t+1]) for one sequence, in float64 from the model's logits."""
    logits = _logits(lm, ids[:-1])
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logits[np.arange(len(ids) - 1), ids[1:]] - logz


def _req(kind: str, *args: object) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_buckets_and_truncation() -> None:
    assert [hz.bucket(n, 128) for n in (1, 16, 17, 33, 100, 128)] == [16, 16, 32, 64, 128, 128]
    assert hz.bucket(40, 48) == 48
    assert hz.truncate_pair([1, 2, 3], [4, 5], 10) == ([1, 2, 3, 4], 2)
    assert hz.truncate_pair([1, 2, 3], [4, 5], 3) == ([2, 3, 4], 2)  # cut from the left
    assert hz.truncate_pair([1], [2, 3, 4, 5, 6], 3) == ([3, 4, 5], 3)  # the continuation itself is cut
    batches = list(hz.by_length([3, 9, 3, 7, 9], 2))
    assert batches == [[1, 4], [3, 0], [2]]  # longest first, ties in request order


def test_loglikelihood_matches_one_sequence_at_a_time(lm: hz.MarinLM) -> None:
    rng = random.Random(5)
    pairs = [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))), " " + rng.choice(WORDS))
             for _ in range(11)]  # 11 requests over batches of 4: a partial batch, several buckets
    got = lm.loglikelihood([_req("loglikelihood", c, x) for c, x in pairs])
    for (ctx, cont), (ll, greedy) in zip(pairs, got, strict=True):
        c, x = lm._encode_pair(ctx, cont)
        ids = [*c, *x][-(SEQ + 1):]  # the pair as the model sees it
        n = min(len(x), len(ids) - 1)
        direct = _direct_logprobs(lm, ids)[-n:]
        assert ll == pytest.approx(direct.sum(), abs=1e-4)
        assert greedy == bool((_logits(lm, ids[:-1])[-n:].argmax(-1) == np.asarray(ids[-n:])).all())
    assert any(len(lm.tok_encode(c)) > SEQ for c, _ in pairs)  # some contexts were cut


def test_loglikelihood_rolling_predicts_every_token_once(lm: hz.MarinLM) -> None:
    text = make_text(random.Random(9), 12)
    ids = lm.tok_encode(text)
    assert len(ids) > 2 * SEQ
    (got,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    # disjoint windows: the first from EOS, the rest from the SEQ tokens before them
    want = 0.0
    for start in range(0, len(ids), SEQ):
        ctx = [lm.eos_id, *ids][max(0, start + 1 - SEQ):start + 1] if start else [lm.eos_id]
        window = [*ctx, *ids[start:start + SEQ]][-(SEQ + 1):]
        want += _direct_logprobs(lm, window)[-len(ids[start:start + SEQ]):].sum()
    assert got == pytest.approx(want, abs=1e-3)


def test_generate_until_is_greedy_and_stops(lm: hz.MarinLM) -> None:
    prompts = ["The king and", "Of the love of heaven the"]
    got = lm.generate_until([_req("generate_until", p, {"until": ["\n\n"], "max_gen_toks": 5}) for p in prompts])
    for prompt, text in zip(prompts, got, strict=True):
        ids = lm.tok_encode(prompt)
        out: list[int] = []
        for _ in range(5):
            out.append(int(_logits(lm, ids + out)[-1].argmax()))
            if out[-1] == lm.eos_id:
                break
        assert text == lm.tok_decode([t for t in out if t != lm.eos_id]).split("\n\n")[0]
    stop = got[0][1:3] if len(got[0]) > 2 else None
    if stop:  # a stop string inside the greedy text ends it there
        (cut,) = lm.generate_until([_req("generate_until", prompts[0], {"until": [stop], "max_gen_toks": 5})])
        assert cut == got[0].split(stop)[0]
