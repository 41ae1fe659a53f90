"""The output projection and the cross-entropy as one function that never holds the (tokens x vocab)
logits: :func:`head_cross_entropy`.

The forward pass goes over the tokens in chunks of ``HEAD_CHUNK``; for each it computes the logits,
the loss and, at once, the chunk's share of both gradients: ``dlogits = (softmax - onehot) * w / W``
(w the token's weight, W their sum), ``dx = dlogits @ head^T`` and ``dhead += x^T @ dlogits``. The
backward pass only scales them by the loss's cotangent. What stays alive for the backward pass is
``dx`` (tokens x d_model) and ``dhead`` (d_model x vocab) instead of the logits and their softmax
(tokens x vocab, f32, each read several times): at d_model 256 / vocab 4096 / 8192 tokens, 12 MB
instead of ~270 MB, and a chunk's logits stay in cache from the matmul that writes them through the
gradient that reads them. The chunks run one after another (each chunk's input ``ops.after`` the
previous chunk's weight gradient): left to its scheduler, XLA computed all 16 chunks' exponentials
first and held 128 MB of them at the step's peak. The same products as autodiff of ``x @ head``
and the softmax cross-entropy, summed in another order (other bits). Computing the gradient in the forward pass
follows Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, arXiv:2410.10989).

Weight gradients go through ``ops.plain_dot`` as in ``ops.matmul``: the narrower
operand (the chunk's inputs) transposed and materialized, so the dot is a plain matmul whose bits
the portable profile fixes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from marin.model.ops import after, plain_dot, wide

HEAD_CHUNK = 512  # tokens per chunk: at vocab 4096 its f32 logits are 8 MiB


def chunks(m: int) -> list[tuple[int, int]]:
    """(start, end) token ranges of ``head_cross_entropy``'s chunks: ``HEAD_CHUNK`` tokens each,
    the last one shorter when ``HEAD_CHUNK`` does not divide ``m``."""
    return [(s, min(s + HEAD_CHUNK, m)) for s in range(0, m, HEAD_CHUNK)]


@jax.custom_vjp
def head_cross_entropy(x: jax.Array, head: jax.Array, targets: jax.Array,
                       weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(weighted mean next-token cross-entropy in nats, weighted share of hits) of the logits
    ``x @ head``: x (M, D) final hidden states, head (D, V), targets (M,) int, weights (M,) f32 (1 for
    every token in pretraining; a fine-tune's mask). A hit is a target whose logit equals the row's
    maximum (a tie counts). Means are over ``max(sum(weights), 1)``. Only the loss has a gradient."""
    return _forward(x, head, targets, weights)[0]


def _chunk(x: jax.Array, head: jax.Array, t: jax.Array, scale: jax.Array) -> tuple[jax.Array, ...]:
    """One chunk: (per-token nll, hits, dx, dhead) with the gradients of sum(scale * nll)."""
    logits = (x @ head).astype(wide(x.dtype))  # (c, V)
    top = logits.max(-1, keepdims=True)
    e = jnp.exp(logits - top)
    z = e.sum(-1, keepdims=True)
    target = jnp.take_along_axis(logits, t[:, None], axis=-1)  # (c, 1)
    nll = (top + jnp.log(z) - target)[:, 0]
    onehot = t[:, None] == jnp.arange(logits.shape[-1])[None, :]
    dlogits = ((e * (1.0 / z) - onehot) * scale[:, None]).astype(x.dtype)  # (c, V)
    dx = dlogits @ head.T  # (c, D)
    dhead = plain_dot(plain_dot(x.T) @ dlogits)  # (D, c) @ (c, V)
    return nll, (target[:, 0] >= top[:, 0]), dx, dhead


def _forward(x: jax.Array, head: jax.Array, targets: jax.Array,
             weights: jax.Array) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, ...]]:
    total = jnp.maximum(weights.sum(), 1.0)
    scale = weights * (1.0 / total)
    loss = hits = jnp.zeros((), wide(x.dtype))
    dxs, dhead = [], None
    head = plain_dot(head)  # (D, V) materialized once (the tied embedding transposed), not per chunk
    for s, e in chunks(x.shape[0]):
        xc = x[s:e]
        if dhead is not None:  # one chunk after the other: a chunk's logits are dead when the next starts
            xc = after(xc, dhead)
        nll, hit, dx, dh = _chunk(xc, head, targets[s:e], scale[s:e])
        loss, hits = loss + (nll * scale[s:e]).sum(), hits + (hit * scale[s:e]).sum()
        dxs.append(dx)
        dhead = dh if dhead is None else dhead + dh
    dx = dxs[0] if len(dxs) == 1 else jnp.concatenate(dxs, axis=0)
    assert dhead is not None  # at least one chunk
    return (loss, hits), (dx, dhead.astype(head.dtype), targets, weights)


def _backward(res: tuple[jax.Array, ...], ct: tuple[jax.Array, Any]) -> tuple[Any, ...]:
    dx, dhead, targets, weights = res
    g = ct[0]  # the loss's cotangent; the hits have none
    no_targets = np.zeros(targets.shape, jax.dtypes.float0)  # integer input: no cotangent
    return dx * g.astype(dx.dtype), dhead * g.astype(dhead.dtype), no_targets, jnp.zeros_like(weights)


head_cross_entropy.defvjp(_forward, _backward)
