"""A small decoder-only transformer in Flax NNX (Llama-style, pre-norm).

    tokens -> Embed -> n_layers x [x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))]
           -> RMSNorm -> logits (tied: x @ embedding.T, untied: separate head)

References:
  - Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762.
  - Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", arXiv:1910.07467.
  - Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
    arXiv:2104.09864 (we use the "rotate-half" layout of GPT-NeoX / Llama).
  - Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202 (SwiGLU).
  - Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from
    Multi-Head Checkpoints", arXiv:2305.13245.
  - Press & Wolf 2017, "Using the Output Embedding to Improve Language Models",
    arXiv:1608.05859 (tied embeddings).
  - Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models",
    arXiv:2302.13971 (the overall recipe).
  - Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2:
    N(0, 0.02) init, residual projections scaled by 1/sqrt(2 * n_layers)).

Shape letters: B batch, T sequence, D d_model, H query heads, K kv heads, G = H // K
query heads per kv head, Dh head dim, F d_ff, V vocab.

Parameters are always float32; `ModelConfig.dtype` is the compute dtype of the matmuls.
Normalisation, softmax and the returned logits are computed in float32, or in float64 when the
compute dtype is float64 (the universal determinism profile: :func:`marin.model.ops.wide`).

Parameter layout (what checkpoints, ``model.safetensors`` and exports see): one module
per projection, kernels ``(d_in, d_out)`` (``y = x @ kernel``, the transpose of a
``torch.nn.Linear`` weight): ``blocks.<i>.attn.{wq,wk,wv,wo}.kernel``,
``blocks.<i>.mlp.{w_gate,w_up,w_down}.kernel``, ``blocks.<i>.{attn_norm,mlp_norm}.scale``,
``final_norm.scale``, ``embed.embedding`` (V, D). For speed the forward pass joins kernels
along their output axis and runs one matmul per group, then splits the result:
``[wq | wk | wv]`` (q, k, v in that order; columns ``h * Dh + j`` of ``wq`` are query head
``h``, of ``wk``/``wv`` kv head ``h``) and ``[w_gate | w_up]`` (gate first). The join is
a small weight copy per step; parameters are never stored joined.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from marin.model.ops import after, matmul, plain_dot, swiglu_down, wide

if TYPE_CHECKING:
    from marin.config_data import ModelParams


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2048
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4  # < n_heads gives grouped-query attention; 1 gives multi-query.
    d_ff: int = 384  # SwiGLU hidden width; ~8/3 * d_model keeps params equal to a 4x GELU MLP.
    max_seq_len: int = 256
    tie_embeddings: bool = True
    rope_theta: float = 10_000.0
    dtype: str = "float32"  # compute dtype: "float32" or "bfloat16".

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @classmethod
    def from_params(cls, m: ModelParams, vocab_size: int) -> ModelConfig:
        """The model params.yaml's ``model`` section declares, over the tokenizer's ``vocab_size``."""
        return cls(vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                   n_kv_heads=m.n_kv_heads, d_ff=m.d_ff, max_seq_len=m.seq_len, tie_embeddings=m.tie_embeddings,
                   rope_theta=m.rope_theta, dtype=m.dtype)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)


def _init(std: float) -> nnx.Initializer:
    return nnx.initializers.normal(stddev=std)


def _dense(cfg: ModelConfig, d_in: int, d_out: int, std: float, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        d_in, d_out, use_bias=False, kernel_init=_init(std), dtype=cfg.compute_dtype, rngs=rngs
    )


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables for positions 0..seq_len-1, each (T, Dh/2), float32, computed on the
    host (in long double, rounded once): constants of the compiled step. Computed with jnp inside
    the step, XLA fused ``cos``/``sin`` into every rope and rope-gradient loop and evaluated
    them once per element, ~8 % of a step's CPU time at d_model 256 / 8 layers. Not float64:
    numpy's float64 ``cos``/``sin`` dispatch to SIMD code by CPU (AVX-512 and AVX2 differ in the
    last bits, and at T=8192 a float32 table entry with them); long double goes through libm's
    scalar ``cosl``/``sinl``, the same on every CPU."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.longdouble) / head_dim)  # (Dh/2,)
    angles = np.arange(seq_len, dtype=np.longdouble)[:, None] * inv_freq[None, :]  # (T, Dh/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: jax.Array, cos: np.ndarray | jax.Array, sin: np.ndarray | jax.Array) -> jax.Array:
    """Rotates channel pairs (i, i + Dh/2) of x (..., T, Dh) by position-dependent angles;
    cos/sin (T, Dh/2) broadcast against x's leading axes (pass them expanded to match).
    Computed in float32 (a no-op cast for float32 x), float64 for float64 x."""
    x1, x2 = jnp.split(x.astype(wide(x.dtype)), 2, axis=-1)  # (..., T, Dh/2) each
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (..., T, Dh)
    return out.astype(x.dtype)


def linear(x: jax.Array, *layers: nnx.Linear) -> jax.Array:
    """x times the kernels of ``layers`` joined along their output axis, in one matmul."""
    kernels = [layer.kernel[...] for layer in layers]
    w = kernels[0] if len(kernels) == 1 else jnp.concatenate(kernels, axis=1)  # (Din, sum Dout)
    return matmul(x, w.astype(x.dtype))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6, rngs: nnx.Rngs):
        del rngs  # deterministic init (ones); kept for a uniform constructor signature.
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))  # (D,)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(wide(x.dtype))  # (B, T, D): float32, or float64 under the universal profile
        inv_rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * inv_rms * self.scale[...]).astype(x.dtype)


ATTENTION_BLOCK = 64  # query positions per block of causal_attention
ATTENTION_CHUNK_SCORES = 4 * 2**20  # float32 scores per batch chunk of causal_attention (16 MiB)


def attention_blocks(t: int) -> list[tuple[int, int]]:
    """(start, end) query positions of each block of ``causal_attention``: blocks of
    ``ATTENTION_BLOCK`` positions when that divides ``t`` (else one block). Block j scores
    only the keys ``[0, end)``: the masked scores above its end are never computed."""
    c = ATTENTION_BLOCK if t % ATTENTION_BLOCK == 0 else t
    return [(s, s + c) for s in range(0, t, c)]


def block_mask(start: int, end: int, g: int) -> np.ndarray:
    """(G*(end - start), end) bool host constant: row r, query position ``start + r // G``,
    sees the keys ``s <= start + r // G``."""
    pos = np.repeat(np.arange(start, end), g)
    return np.arange(end)[None, :] <= pos[:, None]


def batch_chunks(b: int, scores_per_example: int) -> list[slice]:
    """Slices of the batch axis for ``causal_attention``: the fewest equal chunks whose
    scores hold at most ``ATTENTION_CHUNK_SCORES`` floats, so a chunk's scores stay in the
    last-level cache from the matmul that writes them through the softmax that reads them."""
    n = next(n for n in range(1, b + 1)
             if n == b or (b % n == 0 and (b // n) * scores_per_example <= ATTENTION_CHUNK_SCORES))
    return [slice(i * (b // n), (i + 1) * (b // n)) for i in range(n)]


def _join(parts: list[jax.Array], axis: int) -> jax.Array:
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=axis)


@jax.custom_vjp
def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax(q k^T + causal mask) v per kv head, f32 scores and probabilities.

    q (B, K, T*G, Dh), already scaled by 1/sqrt(Dh): row ``i * G + g`` is position i of the
    g-th query head of kv head k (position-major, so a block of positions is a contiguous
    slice); k, v (B, K, T, Dh). Returns (B, K, T*G, Dh).

    Computed by batch chunks (``batch_chunks``) and, within one, by blocks of query positions
    (``attention_blocks``), each scoring only the keys up to its own end: at T = 256, 10/16
    of the full (T, T) scores (docs/performance.md).
    The gradient is written out (Dao et al. 2022, "FlashAttention", arXiv:2205.14135,
    eq. for dS): ``dS = P * (dP - rowsum(dO * O))``. The row sum over the (T, Dh) output
    replaces autodiff's row sum over the (T, T) product ``dP * P`` and the probabilities
    saved by the forward pass are reused, nothing (T, T) is recomputed."""
    return _attention_fwd(q, k, v)[0]


def _chunks(q: jax.Array, k: jax.Array) -> list[slice]:
    return batch_chunks(q.shape[0], q.shape[1] * q.shape[2] * k.shape[2])


def _attention_fwd(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[Any, ...]]:
    parts = [_blocks_fwd(q[c], k[c], v[c]) for c in _chunks(q, k)]  # (output, probabilities) per chunk
    o = _join([out for out, _ in parts], 0)
    return o, (q, k, v, tuple(ps for _, ps in parts), o)


def _attention_bwd(res: tuple[Any, ...], do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v, ps, o = after(res, do)
    grads = [_blocks_bwd(q[c], k[c], v[c], p, o[c], do[c]) for c, p in zip(_chunks(q, k), ps, strict=True)]
    dq, dk, dv = (_join(list(g), 0) for g in zip(*grads, strict=True))
    return dq, dk, dv


def _blocks_fwd(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One batch chunk: the output and each block's probabilities (B, K, G*c, end) f32."""
    g = q.shape[2] // k.shape[2]
    outs, ps = [], []
    for start, end in attention_blocks(k.shape[2]):
        s = jnp.einsum("bkqd,bksd->bkqs", q[:, :, start * g:end * g], k[:, :, :end],
                       preferred_element_type=wide(q.dtype))  # (B, K, G*c, end)
        s = jnp.where(block_mask(start, end, g), s, jnp.finfo(jnp.float32).min)
        e = jnp.exp(s - s.max(-1, keepdims=True))
        ps.append(e * (1.0 / e.sum(-1, keepdims=True)))
        outs.append(jnp.einsum("bkqs,bksd->bkqd", ps[-1].astype(v.dtype), v[:, :, :end]))  # (B, K, G*c, Dh)
    return _join(outs, 2), tuple(ps)


def _pad_keys(x: jax.Array, t: int) -> jax.Array:
    """(B, K, end, Dh) -> (B, K, t, Dh), zeros after ``end``."""
    return jnp.pad(x, ((0, 0), (0, 0), (0, t - x.shape[2]), (0, 0)))


def _blocks_bwd(q: jax.Array, k: jax.Array, v: jax.Array, ps: tuple[jax.Array, ...], o: jax.Array,
                do: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One batch chunk's (dq, dk, dv); dk and dv sum the blocks' gradients over their keys."""
    t = k.shape[2]
    g = q.shape[2] // t
    acc = wide(do.dtype)
    rows = jnp.sum(do.astype(acc) * o.astype(acc), -1, keepdims=True)  # (B, K, T*G, 1)
    dqs, dks, dvs = [], [], []
    for (start, end), p in zip(attention_blocks(t), ps, strict=True):
        sl = slice(start * g, end * g)
        p_t = plain_dot(jnp.swapaxes(p.astype(v.dtype), 2, 3))  # (B, K, end, G*c): a plain dot (matmul)
        dvs.append(_pad_keys(jnp.einsum("bksq,bkqd->bksd", p_t, do[:, :, sl]), t))
        dp = jnp.einsum("bkqd,bksd->bkqs", do[:, :, sl], v[:, :, :end], preferred_element_type=acc)
        ds = (p * (dp - rows[:, :, sl])).astype(q.dtype)  # masked entries: p = 0, so ds = 0
        dqs.append(jnp.einsum("bkqs,bksd->bkqd", ds, k[:, :, :end]))  # (B, K, G*c, Dh)
        ds_t = plain_dot(jnp.swapaxes(ds, 2, 3))
        dks.append(_pad_keys(jnp.einsum("bksq,bkqd->bksd", ds_t, q[:, :, sl]), t))
    return _join(dqs, 2), sum(dks[1:], dks[0]), sum(dvs[1:], dvs[0])


causal_attention.defvjp(_attention_fwd, _attention_bwd)


class Attention(nnx.Module):
    """Causal multi-head self-attention with rotary embeddings and optional GQA."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d, hd = cfg.d_model, cfg.head_dim
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        self.wq = _dense(cfg, d, cfg.n_heads * hd, 0.02, rngs)
        self.wk = _dense(cfg, d, cfg.n_kv_heads * hd, 0.02, rngs)
        self.wv = _dense(cfg, d, cfg.n_kv_heads * hd, 0.02, rngs)
        self.wo = _dense(cfg, cfg.n_heads * hd, d, out_std, rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        b, t, _ = x.shape  # (B, T, D)
        h, k, dh = self.n_heads, self.n_kv_heads, self.head_dim
        g = h // k
        # One matmul for q, k and v (kernels joined in that order; the parameters stay separate).
        qkv = linear(x, self.wq, self.wk, self.wv).reshape(b, t, h + 2 * k, dh)  # (B, T, H + 2K, Dh)
        # q as (B, K, T, G, Dh): query head h is kv head h // G; rope, then the 1/sqrt(Dh) scale.
        q = qkv[:, :, :h].reshape(b, t, k, g, dh).transpose(0, 2, 1, 3, 4)
        q = apply_rope(q, cos[:, None], sin[:, None]) * (1.0 / math.sqrt(dh))
        kv = qkv[:, :, h:].transpose(0, 2, 1, 3)  # (B, 2K, T, Dh): k heads, then v heads
        out = causal_attention(q.reshape(b, k, t * g, dh), apply_rope(kv[:, :k], cos, sin), kv[:, k:])
        out = out.reshape(b, k, t, g, dh).transpose(0, 2, 1, 3, 4).reshape(b, t, h * dh)  # (B, T, H*Dh)
        return linear(out, self.wo)  # (B, T, D)


class SwiGLU(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        self.w_gate = _dense(cfg, cfg.d_model, cfg.d_ff, 0.02, rngs)
        self.w_up = _dense(cfg, cfg.d_model, cfg.d_ff, 0.02, rngs)
        self.w_down = _dense(cfg, cfg.d_ff, cfg.d_model, out_std, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        # One matmul for gate and up (kernels joined, gate first); the activation and the down
        # projection as one function that keeps only [gate | up] for the backward pass.
        gu = linear(x, self.w_gate, self.w_up)  # (B, T, 2F)
        return swiglu_down(gu, self.w_down.kernel[...].astype(gu.dtype))  # (B, T, D)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, rngs=rngs)
        self.mlp = SwiGLU(cfg, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), cos, sin)  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, D)


class Transformer(nnx.Module):
    """Decoder-only LM: int tokens (B, T) -> float32 logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg  # static (hashable frozen dataclass), part of the graphdef.
        self.embed = nnx.Embed(
            cfg.vocab_size, cfg.d_model, embedding_init=_init(0.02), dtype=cfg.compute_dtype,
            rngs=rngs,
        )
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model, rngs=rngs)
        self.lm_head = None if cfg.tie_embeddings else _dense(
            cfg, cfg.d_model, cfg.vocab_size, 0.02, rngs
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.hidden(tokens)  # (B, T, D)
        if self.lm_head is None:  # tied: x @ embedding.T
            logits = matmul(x, self.embed.embedding[...].astype(x.dtype).T)  # (B, T, V)
        else:
            logits = linear(x, self.lm_head)  # (B, T, V)
        return logits.astype(wide(x.dtype))

    def hidden(self, tokens: jax.Array) -> jax.Array:
        """The final normed hidden states (B, T, D) that the output projection takes."""
        _, t = tokens.shape  # (B, T)
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} > max_seq_len {self.cfg.max_seq_len}")
        cos, sin = rope_tables(t, self.cfg.head_dim, self.cfg.rope_theta)  # (T, Dh/2) each
        x = self.embed(tokens)  # (B, T, D)
        for block in self.blocks:
            x = block(x, cos, sin)  # pyright: ignore[reportArgumentType]  # (B, T, D)
        return self.final_norm(x)  # (B, T, D)

    def head(self, dtype: Any) -> jax.Array:
        """The output projection's kernel (D, V) in ``dtype``: the embedding transposed when tied."""
        if self.lm_head is None:
            return self.embed.embedding[...].astype(dtype).T
        return self.lm_head.kernel[...].astype(dtype)


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))
