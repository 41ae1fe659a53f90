"""marin's model and train step in PyTorch as a PyTorch user writes it for speed, the reference
of benchmarks/bench_train.py. Same architecture and sizes: RMSNorm, rotary embeddings
(rotate-half), SwiGLU, grouped-query causal attention, tied embeddings; AdamW (weight decay on
matrices only) after global-norm clipping.

Idiomatic: attention is ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` (no
T x T mask, no repeated K/V), the optimizer ``AdamW(fused=True)``, clipping ``foreach``; mode
``compile`` puts the whole step (forward, loss, backward, clip, optimizer) under
``torch.compile``, mode ``eager`` runs the same code without it.

One measurement per process, so that its peak RSS is its own:

    python benchmarks/torch_reference.py '<config json>' eager|compile STEPS

prints one JSON line: tokens_per_s over STEPS timed steps (after the first step, whose time is
``compile_s``, and two warm-up steps), compile_s, peak_rss_bytes (``getrusage``).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from marin import allocator  # stdlib only: any Python that has torch runs it

allocator.tune_jemalloc()  # jemalloc as bench_train's JAX worker has it, before the first block is allocated
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.scale = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def rope(x, cos, sin):  # x (B, N, T, Dh); cos, sin (T, Dh/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, k = c["d_model"], c["n_heads"], c["n_kv_heads"]
        self.h, self.k, self.dh = h, k, d // h
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.wq = nn.Linear(d, h * self.dh, bias=False)
        self.wk = nn.Linear(d, k * self.dh, bias=False)
        self.wv = nn.Linear(d, k * self.dh, bias=False)
        self.wo = nn.Linear(h * self.dh, d, bias=False)
        self.gate = nn.Linear(d, c["d_ff"], bias=False)
        self.up = nn.Linear(d, c["d_ff"], bias=False)
        self.down = nn.Linear(c["d_ff"], d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        y = self.n1(x)
        q = rope(self.wq(y).view(b, t, self.h, self.dh).transpose(1, 2), cos, sin)
        k = rope(self.wk(y).view(b, t, self.k, self.dh).transpose(1, 2), cos, sin)
        v = self.wv(y).view(b, t, self.k, self.dh).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.k)
        x = x + self.wo(o.transpose(1, 2).reshape(b, t, -1))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c["vocab_size"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["d_model"])
        dh = c["d_model"] // c["n_heads"]
        inv = c["rope_theta"] ** (-torch.arange(0, dh, 2).float() / dh)
        ang = torch.arange(c["seq_len"]).float()[:, None] * inv[None]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.norm(x) @ self.embed.weight.T


def make_step(c: dict, mode: str):
    torch.manual_seed(0)
    torch.set_num_threads(c["threads"])
    model = LM(c)
    decay = [q for q in model.parameters() if q.ndim >= 2]  # as marin: matrices only
    rest = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"], weight_decay=c["weight_decay"],
                            fused=True)

    def step(x):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"], foreach=True)
        opt.step()
        return loss.detach()

    return torch.compile(step) if mode == "compile" else step


def main(conf: str, mode: str, steps: int) -> None:
    c = json.loads(conf)
    step = make_step(c, mode)
    x = torch.randint(0, c["vocab_size"], (c["batch_size"], c["seq_len"] + 1),
                      generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    step(x)
    compile_s = time.perf_counter() - t0
    for _ in range(2):
        step(x)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(x)
    float(loss)
    tps = steps * c["batch_size"] * c["seq_len"] / (time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"tokens_per_s": tps, "compile_s": compile_s, "peak_rss_bytes": rss,
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
