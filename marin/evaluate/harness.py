"""lm-evaluation-harness on marin's own JAX model: an ``lm_eval`` ``LM`` with no torch.

:class:`MarinLM` answers the harness's three request types over the transformer of
:mod:`marin.model.transformer` and the project's ``tokenizers`` JSON, as lm-eval's ``hf`` model
does over a transformers checkpoint (Levanter's ``eval_harness.py`` is the design followed):

- ``loglikelihood``: context and continuation tokenized together, the pair cut from the left to
  ``seq_len + 1`` tokens; the summed log-probability of the continuation and whether greedy
  decoding would have produced it.
- ``loglikelihood_rolling``: a document scored in disjoint windows of ``seq_len`` tokens, each
  predicted from the window before it (lm-eval's ``get_rolling_token_windows``).
- ``generate_until``: greedy decoding from the context as given (no prefix token, as ``hf``), the
  window sliding left past ``seq_len``, stopped at any ``until`` string, the end-of-text token or
  ``max_gen_toks`` (a task asking for more than ``seq_len`` tokens is refused: :func:`gen_limit`).

Requests are sorted by length (longest first), batched ``batch_size`` at a time and padded on the
right to a bucket of 16 · 2^k tokens (causal attention: padding after a token changes nothing
before it), so a handful of compiled shapes serve every request. Results return in request order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from marin.errors import StageError

MIN_BUCKET = 16  # the shortest padded length; buckets double up to seq_len


def bucket(n: int, seq_len: int) -> int:
    """The padded length for a row of ``n`` tokens: 16 · 2^k, at most ``seq_len``."""
    b = MIN_BUCKET
    while b < n:
        b *= 2
    return min(b, seq_len)


def truncate_pair(context: Sequence[int], continuation: Sequence[int], seq_len: int) -> tuple[list[int], int]:
    """The model input for scoring ``continuation`` after ``context``: the whole pair cut from the
    left to ``seq_len + 1`` tokens, less its last token, and the number of continuation tokens."""
    whole = [*context, *continuation][-(seq_len + 1):]
    return whole[:-1], min(len(continuation), len(whole) - 1)


def by_length(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Request indices, longest first (ties in request order), in batches of ``batch_size``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


class MarinLM(TemplateLM):
    """lm-eval's model interface over a marin transformer (graphdef, params) and tokenizer."""

    def __init__(self, graphdef: nnx.GraphDef, params: Any, tokenizer: Any, eos_id: int, seq_len: int,
                 batch_size: int = 32, max_gen_toks: int = 64, rounder: Any = None):
        super().__init__()
        self.graphdef, self.params, self.tok = graphdef, params, tokenizer
        self.eos_id, self.seq_len, self.batch_size, self.max_gen_toks = eos_id, seq_len, batch_size, max_gen_toks
        self.requests_scored = 0
        if rounder is not None:  # universal: float64 rounded with the stage's log
            self._universal(rounder)
            return

        def logits(p: Any, x: jax.Array) -> jax.Array:
            return nnx.merge(graphdef, p)(x)  # (B, T, V)

        def token_logprobs(p: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
            logp = jax.nn.log_softmax(logits(p, x), axis=-1)  # (B, T, V)
            return jnp.take_along_axis(logp, y[..., None], -1)[..., 0], jnp.argmax(logp, -1) == y  # (B, T) x2

        def next_tokens(p: Any, x: jax.Array, last: jax.Array) -> jax.Array:
            out = logits(p, x)  # (B, T, V)
            return jnp.argmax(jnp.take_along_axis(out, last[:, None, None], 1)[:, 0], -1)  # (B,)

        self._token_logprobs, self._next_tokens = jax.jit(token_logprobs), jax.jit(next_tokens)

    def _universal(self, rounder: Any) -> None:
        """The same functions in float64 (``graphdef`` computes in it), each output rounded to float32 with
        the log of ``rounder`` (:class:`marin.evaluate.universal_scoring.Rounder`); the argmaxes are taken
        of the rounded logits on the host, so a near tie is a logged rounding."""
        logits = rounder.forward(self.graphdef)

        def wide_logprobs(p: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
            out = logits(p, x)  # (B, T, V)
            logp = jax.nn.log_softmax(out, axis=-1)
            return jnp.take_along_axis(logp, y[..., None], -1)[..., 0], out

        def wide_next(p: Any, x: jax.Array, last: jax.Array) -> jax.Array:
            return jnp.take_along_axis(logits(p, x), last[:, None, None], 1)[:, 0]  # (B, V)

        scored, following = rounder.jit("loglik", wide_logprobs), rounder.jit("next", wide_next)

        def token_logprobs(p: Any, x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
            logp, out = scored(p, x, y)
            return np.asarray(logp), np.asarray(out).argmax(-1) == np.asarray(y)

        self._token_logprobs = token_logprobs
        self._next_tokens = lambda p, x, last: np.asarray(following(p, x, last)).argmax(-1)

    @property
    def eot_token_id(self) -> int:
        return self.eos_id

    @property
    def max_length(self) -> int:
        return self.seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode(string, add_special_tokens=False).ids  # as in the token shards

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        rows = [truncate_pair(ctx, cont, self.seq_len) for _, ctx, cont in requests]
        out: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        for batch in by_length([len(r[0]) for r in rows], self.batch_size):
            t = bucket(len(rows[batch[0]][0]), self.seq_len)  # the longest row of the batch
            xs = np.full((self.batch_size, t), self.eos_id, dtype=np.int32)
            ys = np.full((self.batch_size, t), self.eos_id, dtype=np.int32)
            for k, i in enumerate(batch):
                inp, n_cont = rows[i]
                cont = requests[i][2][-n_cont:] if n_cont else []
                xs[k, :len(inp)] = inp
                ys[k, len(inp) - n_cont:len(inp)] = cont
            logp, greedy = (np.asarray(a) for a in self._token_logprobs(self.params, xs, ys))
            for k, i in enumerate(batch):
                n, n_cont = len(rows[i][0]), rows[i][1]
                out[i] = (float(logp[k, n - n_cont:n].astype(np.float64).sum()), bool(greedy[k, n - n_cont:n].all()))
        self.requests_scored += len(requests)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, req in enumerate(requests):
            (text,) = req.args
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.eos_id, max_seq_len=self.seq_len,
                    context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[i] += ll
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = [""] * len(requests)
        prompts = [self.tok_encode(req.args[0]) for req in requests]
        for batch in by_length([len(p) for p in prompts], self.batch_size):
            texts = self._greedy([prompts[i] for i in batch], [requests[i].args[1] for i in batch])
            for i, text in zip(batch, texts, strict=True):
                out[i] = text
        return out

    def _greedy(self, prompts: list[list[int]], kwargs: list[dict[str, Any]]) -> list[str]:
        """Greedy continuations of a batch of prompts, each cut at its first ``until`` string."""
        until = [_stops(kw, self.tok_decode([self.eos_id])) for kw in kwargs]
        limit = [gen_limit(kw, self.max_gen_toks, self.seq_len) for kw in kwargs]
        gen: list[list[int]] = [[] for _ in prompts]
        live = [True] * len(prompts)
        while any(live):
            windows = [[*(p or [self.eos_id]), *g][-self.seq_len:] for p, g in zip(prompts, gen, strict=True)]
            xs = np.full((self.batch_size, self.seq_len), self.eos_id, dtype=np.int32)
            last = np.zeros(self.batch_size, dtype=np.int32)
            for k, w in enumerate(windows):
                xs[k, :len(w)], last[k] = w, len(w) - 1
            nxt = np.asarray(self._next_tokens(self.params, xs, last))
            for k in range(len(prompts)):
                if live[k]:
                    gen[k].append(int(nxt[k]))
                    text = self.tok_decode(gen[k])
                    live[k] = (len(gen[k]) < limit[k] and int(nxt[k]) != self.eos_id
                               and not any(s in text for s in until[k]))
        return [_cut(self.tok_decode([t for t in g if t != self.eos_id]), stops) for g, stops in zip(gen, until,
                                                                                                      strict=True)]


def gen_limit(kwargs: dict[str, Any], default: int, seq_len: int) -> int:
    """A request's ``max_gen_toks`` (a task YAML's ``generation_kwargs``, else ``default``): refused, in
    one line, unless it is 1 to the model's ``seq_len`` (a YAML asking for a billion tokens would run, or
    allocate, without end; the model sees no more than ``seq_len`` tokens anyway)."""
    value = kwargs.get("max_gen_toks", default)
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise StageError(f"max_gen_toks {str(value)[:40]!r} is not a number of tokens; fix the task YAML's "
                         "generation_kwargs")
    n = int(value)
    if not 1 <= n <= seq_len:
        raise StageError(f"max_gen_toks {n} is outside 1 to the model's seq_len {seq_len}; set the task YAML's "
                         f"generation_kwargs.max_gen_toks to {seq_len} or less")
    return n


def _stops(kwargs: dict[str, Any], eos_text: str) -> list[str]:
    until = kwargs.get("until") or []
    return [s for s in (*([until] if isinstance(until, str) else until), eos_text) if s]


def _cut(text: str, stops: list[str]) -> str:
    """``text`` up to its first stop string."""
    for s in stops:
        text = text.split(s)[0]
    return text


class UnigramLM(TemplateLM):
    """The same requests under the add-one-smoothed unigram model of the train tokens (the baseline
    of :mod:`marin.evaluate.scoring`): a continuation's log-likelihood ignores its context, its
    greedy continuation is the most frequent token, repeated."""

    def __init__(self, counts: np.ndarray, tokenizer: Any, eos_id: int, seq_len: int, max_gen_toks: int = 64,
                 logp: np.ndarray | None = None):
        super().__init__()
        smoothed = (counts + 1).astype(np.float64)  # marin.evaluate.scoring.unigram_logp, without its imports
        self.logp = np.log(smoothed / smoothed.sum()) if logp is None else logp  # given: universal's, rounded
        self.best = int(np.argmax(counts))
        self.tok, self.eos_id, self.seq_len, self.max_gen_toks = tokenizer, eos_id, seq_len, max_gen_toks

    @property
    def eot_token_id(self) -> int:
        return self.eos_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode(string, add_special_tokens=False).ids

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        out = []
        for _, ctx, cont in requests:
            n = truncate_pair(ctx, cont, self.seq_len)[1]  # as the model sees it
            tail = cont[len(cont) - n:]
            out.append((float(self.logp[tail].sum()), all(t == self.best for t in tail)))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        return [float(self.logp[self.tok_encode(req.args[0])].sum()) for req in requests]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        eos_text = self.tok.decode([self.eos_id])
        return [_cut(self.tok.decode([self.best] * gen_limit(req.args[1], self.max_gen_toks, self.seq_len)),
                     _stops(req.args[1], eos_text)) for req in requests]
