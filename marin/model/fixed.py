"""Sums and dots whose order of additions the program fixes, not the kernel library: the portable
profile's (docs/architecture.md, "Portable bits"), so that x86-64 and aarch64 compute the same bits.

Measured under qemu-aarch64 against x86-64 (jax 0.10.2, the portable XLA flags): elementwise ops, max,
sums over a leading axis and plain dots contracting at most 512 give the same bits on both; sums
along the last axis (``x.sum(-1)``, ``mean``, softmax's denominator, ``logsumexp``), whole-array sums,
matrix-vector products and dots contracting 1024 or more do not (a YNNPACK fusion or kernel that
adds in another order on NEON). So under the portable profile:

- :func:`rowsum` adds the last axis as a pairwise tree of elementwise adds (halves, an odd last
  element carried), each level materialized behind an optimization barrier (without it XLA
  fuses the levels into one loop that recomputes each level for every use);
- :func:`total` sums an array down its leading axis in rows of ``ROW`` (XLA's own column-wise
  loop), then the row by :func:`rowsum`;
- :func:`dot` cuts the contraction into pieces of at most ``DOT_K`` and adds the pieces' products
  in order.

Under the native profile each is the plain jnp operation (the fastest kernels, other bits).
``use(profile)`` is called by :func:`marin.train.runtime.configure`, before anything is traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DOT_K = 512  # the longest contraction measured equal on x86-64 (AVX2) and aarch64 (NEON)
ROW = 128  # width of the rows a whole-array sum first adds down
_portable = False


def use(profile: str) -> None:
    """Fix the order of sums and dots (``portable``) or leave it to the kernels (``native``)."""
    global _portable
    _portable = profile == "portable"


def portable() -> bool:
    return _portable


def rowsum(x: jax.Array, keepdims: bool = False) -> jax.Array:
    """``x.sum(-1)``; under the portable profile a pairwise tree of adds."""
    if not _portable:
        return x.sum(-1, keepdims=keepdims)
    x = jax.lax.optimization_barrier(x)  # materialized: a product fused into the first adds rounds per CPU (FMA)
    while x.shape[-1] > 1:
        n, half = x.shape[-1], x.shape[-1] // 2
        y = x[..., :half] + x[..., half:2 * half]
        x = jax.lax.optimization_barrier(jnp.concatenate([y, x[..., 2 * half:]], -1) if n % 2 else y)
    return x if keepdims else x[..., 0]


def rowmean(x: jax.Array, keepdims: bool = False) -> jax.Array:
    """``jnp.mean(x, -1)``: the sum divided by the length, as jnp computes it."""
    if not _portable:
        return jnp.mean(x, axis=-1, keepdims=keepdims)
    return rowsum(x, keepdims) / jnp.asarray(x.shape[-1], x.dtype)


def total(x: jax.Array) -> jax.Array:
    """``x.sum()``; under the portable profile rows of ``ROW`` added down, then the row."""
    if not _portable:
        return x.sum()
    flat = x.reshape(-1)
    if flat.shape[0] <= ROW:
        return rowsum(flat)
    pad = -flat.shape[0] % ROW
    rows = jnp.pad(flat, (0, pad)).reshape(-1, ROW)  # zeros: x + 0 is x
    return rowsum(jax.lax.optimization_barrier(rows.sum(0)))


def sumsq(tree: object) -> jax.Array:
    """The sum of every leaf's squares (the square of ``optax.global_norm``), leaf by leaf in order."""
    parts = [total(jnp.square(leaf)) for leaf in jax.tree.leaves(tree)]
    return sum(parts[1:], parts[0])


def global_norm(tree: object) -> jax.Array:
    """``optax.global_norm``; under the portable profile from :func:`sumsq`."""
    if not _portable:
        import optax

        return optax.global_norm(tree)
    return jnp.sqrt(sumsq(tree))


def dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` (a (..., K), b (K, N)); under the portable profile in pieces of at most ``DOT_K``
    along K, added in order."""
    k = a.shape[-1]
    if not _portable or k <= DOT_K:
        return a @ b
    out = None
    for s in range(0, k, DOT_K):
        part = a[..., s:s + DOT_K] @ b[s:s + DOT_K]
        out = part if out is None else out + part
    assert out is not None
    return out


def colsum(x: jax.Array) -> jax.Array:
    """``x (M, N).sum(0)``, materialized first: XLA's own loop down each column, the same on every CPU."""
    return jax.lax.optimization_barrier(x).sum(0)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``x * rsqrt(mean(x^2) + eps) * scale`` over the last axis (x float32 (..., D), scale (D,)). Autodiff's
    gradient of ``scale`` sums over the tokens in an XLA reduction whose order follows the CPU; here it is
    :func:`colsum`. The gradient of ``x`` is autodiff's (through :func:`rowmean`'s tree: the same on x86-64 and
    aarch64, measured; a hand-written one, ``g s r - x r^3 sum(g s x) / D``, was not: the two products and their
    difference fuse into an FMA that each CPU's compiler forms from another product)."""
    return _scaled(x * jax.lax.rsqrt(rowmean(x * x, keepdims=True) + eps), scale)


@jax.custom_vjp
def _scaled(y: jax.Array, scale: jax.Array) -> jax.Array:
    return y * scale


def _scaled_fwd(y: jax.Array, scale: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return y * scale, (y, scale)


def _scaled_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    y, scale = res
    return g * scale, colsum((g * y).reshape(-1, y.shape[-1])).astype(scale.dtype)


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def log_softmax(logits: jax.Array) -> jax.Array:
    """``jax.nn.log_softmax(logits, -1)``; under the portable profile with :func:`rowsum`."""
    if not _portable:
        return jax.nn.log_softmax(logits, axis=-1)
    shifted = logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True))
    return shifted - jnp.log(rowsum(jnp.exp(shifted), keepdims=True))
