"""The portable profile's sums and dots (marin/model/fixed.py): each adds in the order it documents,
checked against the same additions done one by one in numpy float32 (IEEE adds, no library order),
and the written-out RMSNorm gradient against autodiff's."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

CHECK = r'''
import numpy as np
from marin.config import RuntimeParams
from marin.train import runtime
runtime.configure(RuntimeParams(2, 1, "replicated", determinism="portable"))
import jax, jax.numpy as jnp
from marin.model import fixed

rng = np.random.default_rng(3)
def tree(x):  # the pairwise tree over the last axis, one add at a time
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        y = x[..., :h] + x[..., h:2 * h]
        x = np.concatenate([y, x[..., 2 * h:]], -1) if x.shape[-1] % 2 else y
    return x[..., 0]

x = rng.standard_normal((6, 37)).astype(np.float32)
assert np.array_equal(np.asarray(jax.jit(fixed.rowsum)(x)), tree(x)), "rowsum"
big = rng.standard_normal(1000).astype(np.float32)
rows = np.concatenate([big, np.zeros(-1000 % fixed.ROW, np.float32)]).reshape(-1, fixed.ROW)
down = rows[0].copy()
for r in rows[1:]:
    down = down + r
assert np.asarray(jax.jit(fixed.total)(big)) == tree(down), "total"
a = rng.standard_normal((5, 1100)).astype(np.float32)
b = rng.standard_normal((1100, 3)).astype(np.float32)
pieces = [np.asarray(jax.jit(jnp.matmul)(a[:, s:s + 512], b[s:s + 512])) for s in range(0, 1100, 512)]
assert np.array_equal(np.asarray(jax.jit(fixed.dot)(a, b)), (pieces[0] + pieces[1]) + pieces[2]), "dot"

h = rng.standard_normal((4, 8, 16)).astype(np.float32)
s = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
g = rng.standard_normal((4, 8, 16)).astype(np.float32)
def plain(h, s):
    return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6) * s
mine = jax.vjp(lambda h, s: fixed.rms_norm(h, s, 1e-6), h, s)
auto = jax.vjp(plain, h, s)
np.testing.assert_allclose(np.asarray(mine[0]), np.asarray(auto[0]), rtol=1e-6, atol=1e-6)
for m, t in zip(mine[1](g), auto[1](g)):
    np.testing.assert_allclose(np.asarray(m), np.asarray(t), rtol=2e-5, atol=2e-5)
fixed.use("native")
assert np.asarray(jax.jit(fixed.rowsum)(x)).dtype == np.float32
print("ok")
'''


def test_the_fixed_sums_and_dots_add_in_their_documented_order() -> None:
    p = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
