"""The model's operations with their own gradients: :func:`matmul` (a weight gradient that
transposes the narrower operand), :func:`plain_dot`, :func:`after` (what orders a backward
computation after its cotangent), and :func:`swiglu_down` (SwiGLU's activation and down projection,
keeping only the joined gate/up projection for the backward pass).

About ``swiglu_down``:

Autodiff of ``(silu(gate) * up) @ w_down`` keeps the gate, the up projection and their product
(the down projection's input) alive from the forward pass to the backward one: three (tokens x
d_ff) float32 arrays per layer, 72 MB at d_model 256 / d_ff 768 / 8192 tokens. Here the backward
pass recomputes the product from the joined ``[gate | up]`` it keeps (one cheap elementwise pass)
and the other two are never held: at that size 384 MB less of the step's temporaries over 8 layers
(docs/performance.md). Same products and sums as autodiff, so the same bits up to the order XLA
picks for the elementwise ops; the down projection's weight gradient transposes the narrower
operand and materializes it, as :func:`matmul` does (portable bits).

Reference: Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


@jax.custom_vjp
def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x (..., Din) @ w (Din, Dout)`` whose weight gradient transposes the narrower operand.

    The weight gradient contracts the flattened token axis M of the input (M, Din) and of
    the output cotangent (M, Dout); XLA's CPU matmul wants one of them transposed first,
    and left alone it transposes the input, whatever its width. Here the narrower one is
    transposed: for the tied output projection (Din = D, Dout = V) that is x rather than
    the (M, V) logit gradient, for ``w_down`` the (M, D) cotangent rather than the (M, F)
    hidden state; of equal widths (``wo``) the cotangent, which XLA materializes, while it fuses
    the ops that produce x (a multiply by a broadcast: :func:`after`'s tie) into the transpose,
    and such a fusion runs ~7x slower than a plain transpose (15 against 2 ms for 8192 x 256 f32
    at one thread). Same products and sums as ``x @ w``'s own gradient, other summation order
    (other bits).

    The transposed operand is materialized (``plain_dot``): a dot that contracts a non-last
    axis of its left operand runs, on XLA's CPU backend, as an Eigen contraction whose multiply
    oneDNN's sgemm computes with blocking and kernels chosen from the CPU at run time (an
    emulated AMD EPYC and this machine differed in the embedding's gradient). A plain
    (M, K) x (K, N) dot goes to YNNPACK, whose results are the same on every x86-64-v3 CPU
    under the portable profile (docs/architecture.md, "Portable bits")."""
    return x @ w


def wide(dtype: Any) -> Any:
    """The dtype norms, softmax and logits are computed in: float32 for float32 and bfloat16 compute,
    float64 for float64 (the universal profile's step), so a float32 trace is unchanged."""
    return jnp.promote_types(dtype, jnp.float32)


def plain_dot(a: jax.Array) -> jax.Array:
    """``a`` materialized where it is: behind an optimization barrier XLA cannot fold a transpose
    (or any layout change) of ``a`` back into the dot that consumes it."""
    return jax.lax.optimization_barrier(a)


def after(x: Any, on: jax.Array) -> Any:
    """``x`` (an array or a tuple of them), exactly, but computed only once ``on`` exists: each
    array times ``1 + 0 * on[0...]``, a data dependency XLA keeps (it does not fold ``0 * s`` for
    floats) and fuses into the consumer, and equal to one whenever ``on`` is finite.

    The backward functions here take their forward inputs ``after`` the cotangent. Without that XLA
    schedules a backward computation as soon as its forward inputs exist: the weight gradients'
    transposes and SwiGLU's recomputed activation ran in the forward pass and their results stayed
    alive until the backward one (docs/performance.md). An optimization barrier does not order
    anything: XLA expands it before it schedules."""
    one = 1 + 0 * on.reshape(-1)[0]
    return jax.tree.map(lambda a: a * one.astype(a.dtype), x)


def _matmul_fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return x @ w, (x, w)


def _matmul_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, w = after(res[0], g), res[1]
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])  # (M, Din), (M, Dout)
    if w.shape[0] < w.shape[1]:  # noqa: SIM108 (one comment per branch)
        dw = plain_dot(plain_dot(x2.T) @ g2)  # x transposed: (Din, M) @ (M, Dout)
    else:
        dw = plain_dot(plain_dot(g2.T) @ x2).T  # g transposed, then the (Dout, Din) result
    return (g @ w.T).astype(x.dtype), dw.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _activation(gu: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(silu(gate) * up, gate, up) of ``gu = [gate | up]`` (..., 2F)."""
    gate, up = jnp.split(gu, 2, axis=-1)
    return jax.nn.silu(gate) * up, gate, up


@jax.custom_vjp
def swiglu_down(gu: jax.Array, w: jax.Array) -> jax.Array:
    """``(silu(gate) * up) @ w`` for ``gu = [gate | up]`` (..., 2F) and ``w`` (F, D)."""
    return _activation(gu)[0] @ w


def _swiglu_fwd(gu: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _activation(gu)[0] @ w, (gu, w)


def _swiglu_bwd(res: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    gu, w = after(res[0], dy), res[1]
    h, gate, up = _activation(gu)  # recomputed: (..., F) each
    dh = dy @ w.T  # (..., F)
    sig = jax.nn.sigmoid(gate)
    dgate = dh * up * (sig * (1 + gate * (1 - sig)))  # d silu(g)/dg = s (1 + g (1 - s))
    dgu = jnp.concatenate([dgate, dh * gate * sig], axis=-1).astype(gu.dtype)
    h2, dy2 = h.reshape(-1, h.shape[-1]), dy.reshape(-1, dy.shape[-1])  # (M, F), (M, D)
    dw = plain_dot(plain_dot(dy2.T) @ h2).T  # the narrower dy transposed: (D, M) @ (M, F), then (F, D)
    return dgu, dw.astype(w.dtype)


swiglu_down.defvjp(_swiglu_fwd, _swiglu_bwd)
