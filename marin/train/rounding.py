"""float64 -> float32 rounding in integer arithmetic, and how far a value lies from an f32 rounding
midpoint: the primitive of the ``universal`` determinism profile (docs/determinism.md).

A universal step computes in float64 and rounds its results to float32. Two machines compute float64
values that differ in their last bits (another summation order, another FMA contraction), and round to
the same float32 unless a value lies near a *midpoint*: halfway between two adjacent float32s. Such a
value goes into the rounding log with the direction it was rounded; a replay takes the direction from the
log (Srivastava, Arora & Boneh 2024, "Optimistic Verifiable Training by Controlling Hardware
Nondeterminism", arXiv:2403.09603).

Every function here is integer arithmetic on the float64's bits, the same in numpy and inside
``jax.jit`` (``xp``: the array namespace of the argument): no hardware conversion, so no flush-to-zero
mode (XLA runs with denormals flushed) and no CPU decides a bit. For a finite float64 ``x`` with
``|x|`` between the adjacent float32s ``lo`` (towards zero) and ``hi = nextafter(lo, inf)``:

    distance(x) = (|x| - (lo + hi) / 2) / (hi - lo)     in [-1/2, 1/2), in units of the float32 ulp

computed exactly; ``x`` is *near* for a threshold ``tau`` when ``|distance| <= tau``. A direction is 1
(the magnitude rounded away from zero, to ``hi``) or 0 (towards zero, to ``lo``); round-to-nearest-even
is 1 when the distance is positive, or zero and ``lo`` odd. Infinities and NaNs have distance -1/2
(never near) and keep their class; a magnitude at or above 2^128 is infinity; float32 denormals are
rounded as IEEE 754 does, whatever the CPU's flush mode.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MANTISSA = (1 << 52) - 1
F32_INF = 0x7F800000


def _xp(x: Any) -> Any:
    return np if isinstance(x, np.ndarray | np.generic) else jnp


def _bits(x: Any, xp: Any) -> Any:
    """The float64's bits as uint64."""
    return x.view(np.uint64) if xp is np else jax.lax.bitcast_convert_type(x, jnp.uint64)


def _f32(bits: Any, xp: Any) -> Any:
    return bits.view(np.float32) if xp is np else jax.lax.bitcast_convert_type(bits, jnp.float32)


def _u64(xp: Any, v: int) -> Any:
    return xp.asarray(v, dtype=xp.uint64)


def decompose(x: Any) -> tuple[Any, Any, Any]:
    """(``lo``'s bits as uint32, sign included; the signed distance from the midpoint in float32 ulps
    (float64); the sign bit as uint32) for every element of the float64 array ``x``."""
    xp = _xp(x)
    x = xp.asarray(x, dtype=xp.float64)
    b = _bits(x, xp)
    sign = (b >> _u64(xp, 63)).astype(xp.uint32)
    e = ((b >> _u64(xp, 52)) & _u64(xp, 0x7FF)).astype(xp.int64)
    m = b & _u64(xp, MANTISSA)
    sig = xp.where(e > 0, m | _u64(xp, 1 << 52), m)  # x = sig * 2^(max(e, 1) - 1075)
    ulp_exp = xp.maximum(e - 1046, -149)  # the float32 ulp of |x|'s binade (denormals: 2^-149)
    shift = xp.clip(ulp_exp - (xp.maximum(e, 1) - 1075), 29, 63).astype(xp.uint64)
    q = sig >> shift  # |x| in float32 ulps, truncated
    rem = (sig - (q << shift)).astype(xp.int64)
    half = (_u64(xp, 1) << (shift - _u64(xp, 1))).astype(xp.int64)
    scale = _f32_ulps(shift, xp)  # 2^-shift, exact
    dist = (rem - half).astype(xp.float64) * scale  # exact: |rem - half| < 2^53 where it matters
    lo = ((ulp_exp + 149).astype(xp.uint32) << xp.uint32(23)) + q.astype(xp.uint32)
    finite = e < 0x7FF
    big = finite & (e >= 1151)  # |x| >= 2^128: infinity
    nan_bits = xp.uint32(0x7FC00000) | (m >> _u64(xp, 29)).astype(xp.uint32)
    lo = xp.where(finite, xp.where(big, xp.uint32(F32_INF), lo), xp.where(m == 0, xp.uint32(F32_INF), nan_bits))
    dist = xp.where(finite & ~big, dist, -0.5)
    return lo | (sign << xp.uint32(31)), dist, sign


def _f32_ulps(shift: Any, xp: Any) -> Any:
    """2^-shift as float64, from its bits (shift <= 63, so a normal number)."""
    bits = (_u64(xp, 1023) - shift) << _u64(xp, 52)
    return bits.view(np.float64) if xp is np else jax.lax.bitcast_convert_type(bits, jnp.float64)


def ulp_exponent(x: Any) -> Any:
    """The exponent of each float64's float32 ulp (``lo``'s spacing): 2^-149 below float32's normals."""
    xp = _xp(x)
    e = ((_bits(xp.asarray(x, dtype=xp.float64), xp) >> _u64(xp, 52)) & _u64(xp, 0x7FF)).astype(xp.int64)
    return xp.maximum(e - 1046, -149)


def scaled_distance(x: Any, scale: Any = None) -> Any:
    """The signed distance of each float64 from its float32 midpoint in units of the float32 ulp of
    ``scale`` (per element, or one for the tensor; default: the tensor's largest finite magnitude), exactly;
    a scale below the value counts as the value. Two machines' float64 results differ by a float64 rounding
    or two of the largest terms that made them, so by a fraction of such a scale's ulp, not of each value's
    own: a sum that cancels to a tiny value can be wrong in every bit it has (docs/determinism.md)."""
    xp = _xp(x)
    x = xp.asarray(x, dtype=xp.float64)
    if scale is None:
        scale = xp.max(xp.abs(xp.where(xp.isfinite(x), x, 0.0))) if x.size else xp.asarray(0.0, dtype=xp.float64)
    scale = xp.abs(xp.asarray(scale, dtype=xp.float64))
    k = xp.clip(ulp_exponent(scale) - ulp_exponent(x), 0, 1022).astype(xp.uint64)  # the value's ulp: 2^-k scale's
    factor = (_u64(xp, 1023) - k) << _u64(xp, 52)
    factor = factor.view(np.float64) if xp is np else jax.lax.bitcast_convert_type(factor, jnp.float64)
    return midpoint_distance(x) * factor


def near_scaled(x: Any, tau: float, scale: Any = None) -> Any:
    """True where a float64 lies within ``tau`` float32 ulps of its scale from a float32 midpoint
    (:func:`scaled_distance`): the universal profile's criterion for a logged value. An exact zero never
    is: zeros come from terms that are absent (a row no token reaches) or cancel exactly, on every machine."""
    xp = _xp(x)
    return (xp.abs(scaled_distance(x, scale)) <= tau) & (xp.asarray(x) != 0)


def midpoint_distance(x: Any) -> Any:
    """The signed distance of each float64 from its float32 midpoint, in float32 ulps ([-1/2, 1/2))."""
    return decompose(x)[1]


def near_midpoint(x: Any, tau: float) -> Any:
    """True where a float64 lies within ``tau`` float32 ulps of a float32 midpoint."""
    return _xp(x).abs(midpoint_distance(x)) <= tau


def nearest_even_direction(dist: Any, lo: Any) -> Any:
    """Round to nearest, ties to even, as a direction (uint32: 1 away from zero, 0 towards)."""
    xp = _xp(dist)
    odd = (lo & xp.uint32(1)) == 1
    return ((dist > 0) | ((dist == 0) & odd)).astype(xp.uint32)


def round_f32(x: Any) -> Any:
    """float64 -> float32, round to nearest, ties to even (IEEE 754's default, denormals kept)."""
    xp = _xp(x)
    lo, dist, _ = decompose(x)
    return _f32(lo + nearest_even_direction(dist, lo), xp)


def round_with(x: Any, index: Any, direction: Any) -> Any:
    """float64 -> float32 rounded to nearest even, except at the flat positions ``index``, rounded in
    the given ``direction`` (1 away from zero, 0 towards): a rounding log applied."""
    xp = _xp(x)
    lo, dist, _ = decompose(x)
    d = nearest_even_direction(dist, lo).reshape(-1)
    if xp is np:
        d = d.copy()
        d[np.asarray(index, np.int64)] = np.asarray(direction, np.uint32)
    else:
        d = d.at[jnp.asarray(index, jnp.int32)].set(jnp.asarray(direction, jnp.uint32))
    return _f32(lo + d.reshape(lo.shape), xp)
