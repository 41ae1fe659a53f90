"""The fused output projection and cross-entropy (marin.model.head_loss) against an independent
float64 NumPy computation of the same loss, accuracy and gradients, across chunk boundaries and
with a fine-tune's zero weights; and the chunking itself."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin.model import head_loss
from marin.model.head_loss import chunks, head_cross_entropy


def reference(x: np.ndarray, w: np.ndarray, t: np.ndarray,
              wt: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(loss, accuracy, dloss/dx, dloss/dw) in float64, the textbook way: full logits, log-softmax."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    logits = x @ w
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    total = max(wt.sum(), 1.0)
    rows = np.arange(len(t))
    loss = -(logp[rows, t] * wt).sum() / total
    acc = ((logits[rows, t] >= logits.max(-1)) * wt).sum() / total
    d = np.exp(logp)
    d[rows, t] -= 1
    d *= (wt / total)[:, None]
    return loss, acc, d @ w.T, x.T @ d


@pytest.mark.parametrize("m", [7, head_loss.HEAD_CHUNK, 2 * head_loss.HEAD_CHUNK + 37])
@pytest.mark.parametrize("masked", [False, True], ids=["pretrain", "finetune"])
def test_loss_accuracy_and_gradients_match_a_float64_reference(m: int, masked: bool) -> None:
    rng = np.random.default_rng(m)
    d, v = 16, 50
    x = rng.normal(size=(m, d)).astype(np.float32)
    w = rng.normal(size=(d, v)).astype(np.float32)
    t = rng.integers(0, v, m).astype(np.int32)
    wt = (rng.random(m) < 0.4).astype(np.float32) if masked else np.ones(m, np.float32)
    x[0] = 0.0  # all logits equal: a tie, which counts as a hit
    (loss, acc), (dx, dw) = jax.value_and_grad(head_cross_entropy, (0, 1), has_aux=True)(x, w, t, wt)
    ref = reference(x, w, t, wt)
    np.testing.assert_allclose(float(loss), ref[0], rtol=1e-5)
    np.testing.assert_allclose(float(acc), ref[1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dx), ref[2], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dw), ref[3], rtol=1e-4, atol=1e-6)


def test_the_gradient_scales_with_the_loss_cotangent() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(9, 4)).astype(np.float32), rng.normal(size=(4, 6)).astype(np.float32)
    t, wt = rng.integers(0, 6, 9).astype(np.int32), np.ones(9, np.float32)
    g1 = jax.grad(lambda x: head_cross_entropy(x, w, t, wt)[0])(x)
    g3 = jax.grad(lambda x: 3.0 * head_cross_entropy(x, w, t, wt)[0])(x)
    np.testing.assert_allclose(np.asarray(g3), 3.0 * np.asarray(g1), rtol=1e-6)


def test_all_weights_zero_gives_zero_loss_and_gradient() -> None:
    x, w = jnp.ones((5, 3)), jnp.ones((3, 4))
    (loss, acc), dx = jax.value_and_grad(head_cross_entropy, has_aux=True)(x, w, jnp.zeros(5, jnp.int32),
                                                                           jnp.zeros(5))
    assert float(loss) == 0.0 and float(acc) == 0.0 and not np.asarray(dx).any()


@pytest.mark.parametrize("m", [1, 511, 512, 513, 4096])
def test_chunks_cover_every_token_once_in_order(m: int) -> None:
    cs = chunks(m)
    assert cs[0][0] == 0 and cs[-1][1] == m
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cs))
    assert all(0 < e - s <= head_loss.HEAD_CHUNK for s, e in cs)
