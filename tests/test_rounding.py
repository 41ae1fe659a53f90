"""The universal profile's rounding primitive (marin.train.rounding): float64 -> float32 by integer
arithmetic, the distance from the float32 midpoint, the near-midpoint mask and a rounding log applied.
Table-driven: exact midpoints and ties, denormals, signs, infinities, NaN, overflow; then numpy's own
conversion (IEEE round-to-nearest-even, no flush-to-zero on the host) over random bits, and the same
functions inside ``jax.jit`` with float64 on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin.train import rounding

ULP1 = 2.0**-23  # float32 ulp at 1
TINY = 2.0**-149  # the smallest float32 denormal
FMAX = float(np.finfo(np.float32).max)

# x, the float32 it rounds to (nearest, ties to even), its distance from the midpoint in float32 ulps
CASES = [
    (1.0, 1.0, -0.5),  # a float32 itself: as far from a midpoint as can be
    (1.0 + ULP1 / 2, 1.0, 0.0),  # exact midpoint, even below (1.0)
    (1.0 + 3 * ULP1 / 2, 1.0 + 2 * ULP1, 0.0),  # exact midpoint, even above
    (1.0 + ULP1 / 2 + 2.0**-52, 1.0 + ULP1, 2.0**-29),  # one float64 ulp above the midpoint
    (1.0 + ULP1 / 2 - 2.0**-52, 1.0, -(2.0**-29)),  # one below
    (-(1.0 + ULP1 / 2), -1.0, 0.0),  # signs: the magnitude is rounded
    (-(1.0 + 3 * ULP1 / 2), -(1.0 + 2 * ULP1), 0.0),
    (1.0 - 2.0**-25, 1.0, 0.0),  # midpoint below a power of two: the lower binade's ulp, even above
    (0.0, 0.0, -0.5),
    (-0.0, -0.0, -0.5),
    (TINY / 2, 0.0, 0.0),  # a tie between 0 and the smallest denormal: 0 is even
    (3 * TINY / 2, 2 * TINY, 0.0),  # a denormal tie, even above
    (TINY * 0.75, TINY, 0.25),
    (-TINY * 0.25, -0.0, -0.25),
    (2.0**-126 - TINY / 2, 2.0**-126, 0.0),  # the largest denormal's midpoint rounds to the smallest normal
    (5e-324, 0.0, -0.5),  # float64's smallest denormal: far below any midpoint
    (FMAX, FMAX, -0.5),
    (FMAX + 2.0**103, float("inf"), 0.0),  # FLT_MAX's midpoint with 2^128: overflows, as IEEE rounds
    (FMAX + 2.0**102, FMAX, -0.25),
    (2.0**128, float("inf"), -0.5),
    (-1e300, -float("inf"), -0.5),
    (float("inf"), float("inf"), -0.5),
    (-float("inf"), -float("inf"), -0.5),
]


@pytest.mark.parametrize(("x", "want", "dist"), CASES)
def test_each_case_rounds_and_measures_as_ieee_does(x: float, want: float, dist: float) -> None:
    got = rounding.round_f32(np.array([x]))
    assert got.dtype == np.float32
    assert got.view(np.uint32)[0] == np.array([want], np.float32).view(np.uint32)[0], (x, got)
    assert rounding.midpoint_distance(np.array([x]))[0] == dist


def test_nan_stays_nan_never_near_and_keeps_its_sign() -> None:
    x = np.array([np.nan, -np.nan])
    got = rounding.round_f32(x)
    assert np.isnan(got).all() and list(np.signbit(got)) == [False, True]
    assert not rounding.near_midpoint(x, 0.49).any()  # any tau below 1/2


def test_near_midpoint_is_the_distance_within_tau() -> None:
    mid = 1.0 + ULP1 / 2
    x = np.array([mid, mid + 2.0**-45, mid - 2.0**-45, mid + 2.0**-40, 1.0, np.inf])
    assert list(rounding.near_midpoint(x, 2.0**-20)) == [True, True, True, False, False, False]
    assert list(rounding.near_midpoint(x, 0.0)) == [True, False, False, False, False, False]


def test_a_log_of_directions_overrides_nearest_even_only_where_it_says() -> None:
    x = np.array([1.0 + ULP1 / 2, -(1.0 + ULP1 / 2), 2.0, 1.0 + 3 * ULP1 / 2])
    got = rounding.round_with(x, [0, 1, 3], [1, 1, 0])
    assert list(got) == [np.float32(1 + ULP1), np.float32(-(1 + ULP1)), np.float32(2.0), np.float32(1 + ULP1)]
    assert list(rounding.round_with(x, [], [])) == list(rounding.round_f32(x))


def test_random_bits_round_as_numpy_converts() -> None:
    rng = np.random.default_rng(56)
    x = np.concatenate([rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64),
                        rng.uniform(-(2.0**-124), 2.0**-124, 100_000),  # the float32 denormal range
                        rng.standard_normal(100_000) * 1e30])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float32)
    got = rounding.round_f32(x)
    ok = ~np.isnan(x)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
    assert np.isnan(got[~ok]).all()
    d = rounding.midpoint_distance(x)
    assert ((d >= -0.5) & (d < 0.5)).all()


def test_inside_jit_with_float64_the_same_bits_as_numpy() -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.integers(0, 2**64, 50_000, dtype=np.uint64).view(np.float64),
                        rng.uniform(-(2.0**-124), 2.0**-124, 50_000), np.array([c[0] for c in CASES])])
    with jax.enable_x64(True):  # this test's arrays only; the process stays float32 for the other tests
        lo, dist, _ = jax.jit(rounding.decompose)(jnp.asarray(x))
        got = np.asarray(jax.jit(rounding.round_f32)(jnp.asarray(x)))
        logged = np.asarray(jax.jit(rounding.round_with)(jnp.asarray(x[:4]), jnp.array([0, 2]), jnp.array([1, 0])))
    want_lo, want_dist, _ = rounding.decompose(x)
    assert np.array_equal(np.asarray(lo), want_lo) and np.array_equal(np.asarray(dist), want_dist)
    assert np.array_equal(got.view(np.uint32), rounding.round_f32(x).view(np.uint32))
    assert np.array_equal(logged.view(np.uint32), rounding.round_with(x[:4], [0, 2], [1, 0]).view(np.uint32))
