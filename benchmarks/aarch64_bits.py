"""Which parts of one train step give other bits on aarch64: run it here and under qemu-aarch64, compare.

    uv run python benchmarks/aarch64_bits.py > x86.txt
    $(scripts/arm64-env.sh) benchmarks/aarch64_bits.py > arm.txt      # ~2-5 min under qemu-aarch64
    uv run python benchmarks/aarch64_bits.py --compare x86.txt arm.txt

A tiny model (d_model 32, 2 layers, vocab 400, 8 x 32 tokens) under the portable profile's runtime: the
digest of the initial parameters, the loss (hex), the final hidden states and every parameter's gradient,
each on its own line. The first line that differs names the part to look at (docs/architecture.md,
"Portable bits", has what was measured with it).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def digests() -> dict[str, str]:
    from marin.config import RuntimeParams
    from marin.train import runtime

    runtime.check_cpu = lambda rt: None  # measure the portable profile's bits where it refuses to train (aarch64)
    runtime.configure(RuntimeParams(xla_cpu_threads=2, devices=1, param_sharding="replicated"))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from marin.model import ModelConfig, Transformer
    from marin.train.step import loss_fn

    def h(a: object) -> str:
        return hashlib.sha256(np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(a)]).tobytes()
                              ).hexdigest()[:16]

    cfg = ModelConfig(vocab_size=400, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=32)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(0))))
    params = nnx.to_pure_dict(params)
    toks = np.random.default_rng(0).integers(0, 400, (8, 33)).astype(np.int32)
    batch = {"inputs": jnp.asarray(toks[:, :-1]), "targets": jnp.asarray(toks[:, 1:])}
    (loss, _), grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(nnx.merge(gd, p), batch), has_aux=True))(params)
    out = {"params": h(params), "loss": float(loss).hex(),
           "hidden": h(jax.jit(lambda p: nnx.merge(gd, p).hidden(batch["inputs"]))(params))}
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        out["grad " + ".".join(str(getattr(k, "key", k)) for k in path)] = h(g)
    return out


def compare(a: Path, b: Path) -> int:
    mine = dict(line.rsplit(" ", 1) for line in a.read_text().splitlines())
    theirs = dict(line.rsplit(" ", 1) for line in b.read_text().splitlines())
    differ = [k for k in mine if mine[k] != theirs.get(k)]
    for k in mine:
        print(f"{'DIFFERS' if k in differ else 'same   '} {k}")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    for key, value in digests().items():
        print(key, value)
