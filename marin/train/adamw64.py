"""The universal profile's AdamW step (marin.train.universal) in float64 from float32 inputs, written so
that two machines compute as much of it bit for bit as IEEE 754 allows, whatever FMA contractions and
library functions their compilers pick.

The same update as ``marin.train.step.make_optimizer`` (global-norm clipping, then AdamW with decay on
matrices; Loshchilov & Hutter 2019, optax's order of operations), with four changes of arithmetic, not of
method:

* the clip factor and the learning rate arrive rounded to float32 (through the rounding log: they come
  from a sum and a cosine, which machines compute differently), and the clipped gradient ``c g`` is
  rounded to float32 too: a product of two float32s is exact in float64, so its rounding is the same
  everywhere;
* beta1, beta2 are their float32 values and ``1 - beta`` is exact: ``b1 mu + (1 - b1) g`` is then a sum of
  two exact products, rounded once, FMA or not, so ``mu`` is identical on every machine. (With the decimal
  0.9 and 0.1, a tenth of the first moments of two float32s in one binade are exact float32 midpoints in
  real arithmetic, and a contraction moves the float64 result off the tie either way: measured, 4 % of
  the first moments were within 2^-29 ulp of a midpoint);
* the bias corrections' powers ``b^t`` by repeated squaring, each product correctly rounded (XLA's ``pow``
  is a polynomial that contractions change);
* what remains inexact (``nu``'s product, the update and the parameter) comes with an error scale per
  element, the magnitude of the terms a rounding of which the machines may differ by: ``nu`` itself
  (a sum of squares cannot cancel), and ``|p| (1 + lr wd) + lr |u|`` for a parameter.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marin.config import TrainParams
from marin.train import rounding


def f32_value(x: float) -> float:
    """``x`` rounded to the nearest float32, as a Python float (exact in float64)."""
    return float(np.float32(x))


def power(base: float, t: Any) -> jax.Array:
    """``base ** t`` for an int32 ``t`` >= 0 by repeated squaring: 31 correctly rounded products in a fixed order."""
    def body(k: int, acc: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        out, sq = acc
        out = jnp.where((t >> k) & 1, out * sq, out)
        return out, sq * sq

    one = jnp.ones((), jnp.float64)
    return jax.lax.fori_loop(0, 31, body, (one, one * base))[0]


class Result(NamedTuple):
    params: Any  # float64
    opt_state: Any  # float64 moments, counts incremented
    scales: Any  # per element of params and opt_state: its error scale (counts as they are)


def _is_state(x: Any) -> bool:
    """An optax state with a step count (ScaleByAdamState, ScaleByScheduleState)."""
    return isinstance(x, tuple) and "count" in getattr(x, "_fields", ())


def update(opt_state: Any, g32: Any, params: Any, clip: jax.Array, lr: jax.Array, tp: TrainParams) -> Result:
    """One AdamW step in float64: ``g32`` the float32 gradient, ``params`` and ``opt_state`` (of
    ``make_optimizer(tp)``) widened to float64 from float32, ``clip`` the float32 clip factor (1 when the
    norm is within ``tp.grad_clip``), ``lr`` the float32 learning rate of this step."""
    b1, b2 = f32_value(tp.beta1), f32_value(tp.beta2)
    c1, c2 = 1.0 - b1, 1.0 - b2  # exact: beta is a float32 in [1/2, 1)
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_state) if isinstance(s, optax.ScaleByAdamState)]
    if len(states) != 1:
        raise ValueError(f"the universal step needs make_optimizer's AdamW state; found {len(states)} Adam states")
    adam = states[0]
    t = adam.count + 1
    bc1, bc2 = 1.0 - power(b1, t), 1.0 - power(b2, t)
    # clip * g is exact in float64 (two float32s): its rounding is the same everywhere
    gc = jax.tree.map(lambda g: rounding.round_f32(clip * g).astype(jnp.float64), g32)
    mu = jax.tree.map(lambda m, g: b1 * m + c1 * g, adam.mu, gc)
    nu = jax.tree.map(lambda v, g: b2 * v + c2 * (g * g), adam.nu, gc)
    wd = tp.weight_decay

    def u(m: jax.Array, v: jax.Array) -> jax.Array:
        return (m / bc1) / (jnp.sqrt(v / bc2) + tp.eps)

    def decay(p: jax.Array) -> float:
        return wd if p.ndim >= 2 else 0.0  # make_optimizer's mask: matrices only

    new_params = jax.tree.map(lambda p, m, v: p - lr * (u(m, v) + decay(p) * p), params, mu, nu)
    s_params = jax.tree.map(lambda p, m, v: jnp.abs(p) * (1 + lr * decay(p)) + lr * jnp.abs(u(m, v)), params, mu, nu)

    def advance(s: Any, scales: bool) -> Any:
        if isinstance(s, optax.ScaleByAdamState):
            return s._replace(count=t, mu=jax.tree.map(jnp.abs, mu) if scales else mu,
                              nu=jax.tree.map(jnp.abs, nu) if scales else nu)
        if _is_state(s):
            return s._replace(count=s.count + 1)
        return s

    new_state = jax.tree.map(lambda s: advance(s, False), opt_state, is_leaf=_is_state)
    s_state = jax.tree.map(lambda s: advance(s, True), opt_state, is_leaf=_is_state)
    return Result(new_params, new_state, (s_params, s_state))
