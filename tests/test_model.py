"""The transformer's fast paths (joined q/k/v and gate/up matmuls, heads-first attention,
the custom weight and attention gradients) against an independent plain NumPy float64 forward pass over
the same parameters, and against JAX's own gradient of ``x @ w``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from marin.model import ModelConfig, Transformer, transformer
from marin.model.ops import after, swiglu_down
from marin.model.transformer import attention_blocks, batch_chunks, block_mask, causal_attention, matmul


def _rms(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def _rope(x: np.ndarray, theta: float) -> np.ndarray:  # x (T, Dh), rotate-half pairs (i, i + Dh/2)
    t, dh = x.shape
    ang = np.arange(t)[:, None] * theta ** (-np.arange(0, dh, 2) / dh)[None, :]
    x1, x2 = x[:, : dh // 2], x[:, dh // 2:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


def reference_logits(p: dict, cfg: ModelConfig, tokens: np.ndarray) -> np.ndarray:
    """One sequence at a time, one head at a time, separate q, k, v kernels; query head h
    reads kv head h // (H / K), like torch's repeat_interleave."""
    f = {k: np.asarray(v, np.float64) for k, v in jax.tree_util.tree_flatten_with_path(p)[0]
         for k in [".".join(str(getattr(q, "key", q)) for q in k)]}
    h, kv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    out = []
    for seq in tokens:
        x = f["embed.embedding"][seq]  # (T, D)
        t = len(seq)
        for i in range(cfg.n_layers):
            b = f"blocks.{i}."
            y = _rms(x, f[b + "attn_norm.scale"])
            q, k, v = (y @ f[b + f"attn.{n}.kernel"] for n in ("wq", "wk", "wv"))
            heads = []
            for j in range(h):
                g = j // (h // kv)
                qj = _rope(q[:, j * dh:(j + 1) * dh], cfg.rope_theta)
                kj = _rope(k[:, g * dh:(g + 1) * dh], cfg.rope_theta)
                s = qj @ kj.T / np.sqrt(dh)
                s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
                e = np.exp(s - s.max(-1, keepdims=True))
                heads.append((e / e.sum(-1, keepdims=True)) @ v[:, g * dh:(g + 1) * dh])
            x = x + np.concatenate(heads, -1) @ f[b + "attn.wo.kernel"]
            y = _rms(x, f[b + "mlp_norm.scale"])
            gate, up = y @ f[b + "mlp.w_gate.kernel"], y @ f[b + "mlp.w_up.kernel"]
            x = x + (gate / (1 + np.exp(-gate)) * up) @ f[b + "mlp.w_down.kernel"]
        out.append(_rms(x, f["final_norm.scale"]) @ f["embed.embedding"].T)
    return np.stack(out)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_forward_matches_a_plain_reference(kv_heads: int) -> None:
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=kv_heads, d_ff=48,
                      max_seq_len=16)
    model = Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3)))
    params = nnx.to_pure_dict(nnx.state(model))
    # Scale the kernels up so attention is far from uniform and a wrong head mapping shows.
    params = jax.tree.map(lambda a: a * 20 if a.ndim == 2 else a, params)
    nnx.update(model, params)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    got = np.asarray(jax.jit(lambda m, x: m(x))(model, tokens), np.float64)
    want = reference_logits(params, cfg, tokens)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("d_in,d_out", [(8, 24), (24, 8)], ids=["wide-out", "wide-in"])
def test_matmul_gradient_is_jax_own(d_in: int, d_out: int) -> None:
    k = jax.random.split(jax.random.key(0), 3)
    x, w = jax.random.normal(k[0], (3, 5, d_in)), jax.random.normal(k[1], (d_in, d_out))
    c = jax.random.normal(k[2], (3, 5, d_out))
    ours = jax.grad(lambda x, w: (matmul(x, w) * c).sum(), (0, 1))(x, w)
    plain = jax.grad(lambda x, w: ((x @ w) * c).sum(), (0, 1))(x, w)
    for a, b in zip(ours, plain, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert jnp.array_equal(matmul(x, w), x @ w)


def _plain_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """JAX autodiff's own attention: softmax with -inf above the diagonal, per group member
    (q's rows are position-major: row i * G + g)."""
    b, kv, tg, dh = q.shape
    t = k.shape[2]
    s = jnp.einsum("bktgd,bksd->bkgts", q.reshape(b, kv, t, tg // t, dh), k)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    o = jnp.einsum("bkgts,bksd->bkgtd", jax.nn.softmax(s, -1), v)
    return o.transpose(0, 1, 3, 2, 4).reshape(q.shape)


@pytest.mark.parametrize("groups,t,chunk_scores", [(1, 1, None), (2, 5, None), (4, 3, None), (2, 128, None),
                                                   (2, 128, 2 * 128 * 128)],
                         ids=["one", "gqa", "mqa-like", "blocks", "blocks-and-chunks"])
def test_attention_gradient_is_jax_own(groups: int, t: int, chunk_scores: int | None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if chunk_scores:  # two chunks of the batch of 2 (3 kv heads x 256 rows x 128 keys each)
        monkeypatch.setattr(transformer, "ATTENTION_CHUNK_SCORES", 3 * chunk_scores)
    k = jax.random.split(jax.random.key(1), 4)
    q = 3 * jax.random.normal(k[0], (2, 3, groups * t, 8))  # large scores: far from uniform
    kk, v = 3 * jax.random.normal(k[1], (2, 3, t, 8)), jax.random.normal(k[2], (2, 3, t, 8))
    c = jax.random.normal(k[3], q.shape)
    ours = jax.jit(jax.grad(lambda *a: (causal_attention(*a) * c).sum(), (0, 1, 2)))(q, kk, v)
    plain = jax.jit(jax.grad(lambda *a: (_plain_attention(*a) * c).sum(), (0, 1, 2)))(q, kk, v)
    np.testing.assert_allclose(jax.jit(causal_attention)(q, kk, v), _plain_attention(q, kk, v), rtol=1e-5,
                               atol=1e-5)
    for a, b in zip(ours, plain, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_attention_blocks_cover_the_positions_and_skip_only_masked_scores() -> None:
    assert attention_blocks(256) == [(0, 64), (64, 128), (128, 192), (192, 256)]
    assert attention_blocks(100) == [(0, 100)]  # 64 does not divide 100: one block
    m = block_mask(64, 128, 2)  # rows: positions 64, 64, 65, 65, ...; keys 0..127
    assert m.shape == (128, 128)
    full = np.tril(np.ones((256, 256), bool))  # the full causal mask, position by position
    np.testing.assert_array_equal(m, np.repeat(full[64:128, :128], 2, axis=0))
    for start, end in attention_blocks(256):  # nothing visible is beyond a block's end
        assert not full[start:end, end:].any()


def test_batch_chunks_are_the_fewest_equal_ones_within_the_budget() -> None:
    per = transformer.ATTENTION_CHUNK_SCORES // 8
    assert [(c.start, c.stop) for c in batch_chunks(32, per)] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert batch_chunks(4, per) == [slice(0, 4)]
    assert len(batch_chunks(3, transformer.ATTENTION_CHUNK_SCORES)) == 3  # one example per chunk at most
    assert len(batch_chunks(5, 2 * transformer.ATTENTION_CHUNK_SCORES)) == 5  # over budget: still one each


def test_the_compiled_step_reads_the_rope_tables_instead_of_evaluating_sines() -> None:
    """Built with jnp inside the step, the (T, Dh/2) tables were fused into every rope loop,
    forward and backward, and a sine and a cosine evaluated per element (docs/performance.md,
    issue 16). The tables are host constants now: no sine or cosine over an array is left."""
    import re

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((2, 16), jnp.int32)

    def loss(p):
        return nnx.merge(graphdef, p)(tokens).sum()

    hlo = jax.jit(jax.value_and_grad(loss)).lower(params).compile().as_text()
    assert re.search(r"= f32\[[0-9,]+\]\S* (sine|cosine)\(", hlo) is None
    assert re.search(r"= f32\[\S+ (multiply|add)\(", hlo)  # the pattern reads this HLO's instruction lines


@pytest.mark.parametrize("f", [8, 24])
def test_swiglu_down_gradient_is_jax_own(f: int) -> None:
    """The fused activation and down projection: same value as the plain expression, and the
    gradient of autodiff through it (a cotangent that is not all ones)."""
    k = jax.random.split(jax.random.key(1), 3)
    gu, w = jax.random.normal(k[0], (3, 5, 2 * f)), jax.random.normal(k[1], (f, 6))
    c = jax.random.normal(k[2], (3, 5, 6))

    def plain(gu: jax.Array, w: jax.Array) -> jax.Array:
        gate, up = jnp.split(gu, 2, axis=-1)
        return (jax.nn.silu(gate) * up) @ w

    np.testing.assert_allclose(swiglu_down(gu, w), plain(gu, w), rtol=1e-6, atol=1e-6)
    ours = jax.grad(lambda gu, w: (swiglu_down(gu, w) * c).sum(), (0, 1))(gu, w)
    theirs = jax.grad(lambda gu, w: (plain(gu, w) * c).sum(), (0, 1))(gu, w)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_after_is_exact_and_waits_for_its_cotangent() -> None:
    """ops.after: the same bits (signed zeros, infinities) for a finite ``on``, and a real data
    dependency on ``on`` in the compiled program: a NaN there reaches every output, which it could
    not had XLA folded ``0 * on`` away (then nothing would order the backward pass's transposes and
    recomputations after its cotangent). A subnormal is flushed to zero, as by every elementwise op
    of XLA's CPU backend (its ``x * y`` with y = 1 alike)."""
    x = np.array([0.0, -0.0, 1.5, -np.inf, np.inf, -3.0e38, 1e-45], np.float32)
    tied = jax.jit(lambda x, on: after((x, x[:3]), on))
    flushed = np.asarray(jax.jit(lambda x, y: x * y)(x, np.float32(1.0)))
    for on in (np.float32(2.0), np.float32(-0.0), np.float32(1e30)):
        a, b = tied(x, np.full((2, 3), on))
        assert np.asarray(a)[:-1].tobytes() == x[:-1].tobytes() and np.asarray(b).tobytes() == x[:3].tobytes()
        assert np.asarray(a).tobytes() == flushed.tobytes()
    a, b = tied(x, np.full((2, 3), np.nan, np.float32))
    assert np.isnan(np.asarray(a)).all() and np.isnan(np.asarray(b)).all()
