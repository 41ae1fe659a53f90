"""The ``universal`` determinism profile in the stages that score the model (evaluate, evaluate_instruct):
the model computes in float64 from the float32 weights, and every output a recorded number comes from
(per-token log-likelihoods, the logits whose argmax is a greedy token) is rounded to float32 with a
rounding log, as a universal train step's results are (:mod:`marin.train.universal`). So are the numbers
the host computes from them through the C library's ``exp`` and ``log`` (perplexity, the unigram
baseline's table, the harness's aggregates), whose last bits each machine's library decides.

An argmax over float32 logits is the same on every machine (a tie goes to the lowest id), so a near tie of
two float64 logits is a logged decision: the rounding of one of them. Sums of float32 values in float64,
counts and their ratios are IEEE operations, the same everywhere.

Each call of a rounded function is one step of the log (``step``: the stage's calls so far), its tensors
named for what they are (``nll``, ``logits``, ``loglik[1]``) and the metrics ``metric.<what>.<name>``.
The log is ``evals/rounding/<stage>.jsonl`` (git-ignored, as evals/ is), recorded as the run's output
``rounding_log`` (its digest in the ledger); ``marin verify`` hands it to the replay
(:mod:`marin.verify.rounding`), which rounds as it says and stops, naming step, tensor and index, at a
value it does not account for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from marin.train import rounding, rounding_log, universal

if TYPE_CHECKING:
    from marin.ledger import Run
    from marin.model.weights import Loaded



class Rounder:
    """A scoring stage's float64 results rounded to float32 with its rounding log (recording or replaying)."""

    def __init__(self, log: universal.RoundingLog):
        self.log, self.step = log, 0

    def jit(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (float64 outputs, pure) jitted with its outputs rounded; each call is a step of the log
        and returns the rounded outputs (float32 arrays), the log's directions applied."""
        tau = self.log.tau

        @jax.jit
        def rounded(*args: Any) -> tuple[Any, Any, Any]:
            out = fn(*args)
            r, near = universal.round_tree(out, tau)
            return r, near, out

        def call(*args: Any) -> Any:
            self.step += 1
            r, near, out = rounded(*args)
            return universal.apply_log(self.log, self.step, name, r, near, out)

        return call

    @staticmethod
    def forward(graphdef: nnx.GraphDef) -> Callable[[Any, Any], Any]:
        """params, tokens -> float64 logits from the float32 weights (``graphdef``: :func:`wide_model`'s)."""
        return lambda p, x: nnx.merge(graphdef, universal.widen(p))(x)

    def table(self, name: str, x: np.ndarray) -> np.ndarray:
        """A float64 array computed on the host, rounded to float32 with the log (one step), as float64."""
        self.step += 1
        r = self.log.round(self.step, name, x)
        return np.asarray(r if r is not None else rounding.round_f32(np.asarray(x, np.float64).reshape(-1)),
                          np.float64).reshape(np.shape(x))

    def values(self, what: str, raw: dict[str, Any]) -> dict[str, Any]:
        """``raw`` with each float rounded to float32 with the log (one step; tensors
        ``metric.<what>.<key>``); other values (counts, text) as they are."""
        self.step += 1
        floats = {k: float(v) for k, v in raw.items() if isinstance(v, float)}
        return {**raw, **self.log.values(self.step, floats, prefix=f"{universal.METRIC}{what}.")}


def wide_model(model: Loaded) -> Loaded:
    """The loaded model with a graph that computes in float64 (its float32 weights are widened in
    :func:`logits_fn`'s and the stages' functions)."""
    from marin.model.transformer import ModelConfig, Transformer

    _, params, config = model
    cfg = dataclasses.replace(ModelConfig(**config["model"]), dtype="float64")
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0], params, config


def forward(graphdef: nnx.GraphDef, rounder: Rounder | None) -> Callable[[Any, Any], Any]:
    """params, tokens -> the model's logits: float32 under the stage's profile, or under universal
    (``rounder``, ``graphdef`` from :func:`wide_model`) float64 from the widened weights."""
    return (lambda p, x: nnx.merge(graphdef, p)(x)) if rounder is None else rounder.forward(graphdef)


def logits_fn(graphdef: nnx.GraphDef, rounder: Rounder | None) -> Callable[[Any, Any], Any]:
    """The jitted logits function the stages take argmaxes of: float32 logits, under universal rounded
    from float64 with the log (``logits``)."""
    f = forward(graphdef, rounder)
    return jax.jit(f) if rounder is None else rounder.jit("logits", f)


def nll_fn(graphdef: nnx.GraphDef, rounder: Rounder | None) -> Callable[[Any, Any, Any], Any]:
    """Per-token negative log-likelihood (B, T): :func:`marin.train.step.eval_nll_fn`, or under universal
    float64 rounded with the log (``nll``)."""
    from marin.train import step

    if rounder is None:
        return step.eval_nll_fn(graphdef)
    import optax

    f = forward(graphdef, rounder)
    return rounder.jit("nll", lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(f(p, x), y))


@contextmanager
def stage_log(root: Path, run: Run, stage: str, determinism: str) -> Iterator[Rounder | None]:
    """The stage's rounding log under universal (None under another profile): recording to
    ``evals/rounding/<stage>.jsonl``, or replaying ``MARIN_ROUNDING_LOG``; recorded as an output at the end."""
    if determinism != "universal":
        yield None
        return
    log = universal.RoundingLog.from_env()
    path = rounding_log.SCORING_DIR / f"{stage}.jsonl"
    log.open(root / path, 0)
    try:
        yield Rounder(log)
    except BaseException:
        if log.file is not None:
            log.file.close()
        raise
    if log.against:  # a replay: for marin verify to name a changed entry (marin.verify.rounding)
        (root / path).with_suffix(rounding_log.AGAINST).write_bytes(
            b"".join(rounding_log.entry(*e) for e in log.against))
    log.close()  # a replay: every recorded entry was met
    run.output(rounding_log.OUTPUT, path)
