"""One train step's gradient at the shipped model's dimensions (params.yaml: d_model, d_ff, heads, vocabulary,
sequence length), the batch cut to B rows, under the runtime params.yaml names: a witness of the shipped
size's bits on an emulated CPU, where a whole stage does not fit.

    uv run python benchmarks/shipped_step.py 2
    qemu-x86_64 -cpu Haswell .venv/bin/python benchmarks/shipped_step.py 2     # the same line is the check

Prints the dimensions, the loss (hex), the sha256 of every gradient (in tree order) and the seconds taken.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(rows: int) -> None:
    t0 = time.time()
    from marin import config
    from marin.train import runtime

    p = config.load(ROOT / "params.yaml")
    runtime.configure(p.runtime)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from marin.model import ModelConfig, Transformer
    from marin.train.step import loss_fn

    m = p.model
    cfg = ModelConfig.from_params(m, p.tokenize.vocab_size)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(0))))
    params = nnx.to_pure_dict(params)
    toks = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, m.seq_len + 1)).astype(np.int32)
    batch = {"inputs": jnp.asarray(toks[:, :-1]), "targets": jnp.asarray(toks[:, 1:])}
    t1 = time.time()
    (loss, _), grads = jax.jit(jax.value_and_grad(lambda q: loss_fn(nnx.merge(gd, q), batch), has_aux=True))(params)
    flat = np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(grads)])
    print(f"d_model {m.d_model} d_ff {m.d_ff} heads {m.n_heads}/{m.n_kv_heads} vocab {cfg.vocab_size} "
          f"seq_len {m.seq_len} rows {rows}: loss {float(loss).hex()} gradients "
          f"sha256:{hashlib.sha256(flat.tobytes()).hexdigest()} (start {t1 - t0:.0f} s, compile+step "
          f"{time.time() - t1:.0f} s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
