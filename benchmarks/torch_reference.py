"""A plain PyTorch (eager, CPU) implementation of marin's model and train step, as the
reference for benchmarks/bench_train.py. Same architecture and sizes: RMSNorm, rotary
embeddings (rotate-half), SwiGLU, grouped-query causal attention, tied embeddings;
AdamW with global-norm clipping. Run as a worker: reads "CONFIG <json>" then
"RUN <steps>" lines on stdin, answers with tokens/s per RUN.
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.scale = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def rope(x, cos, sin):  # x (B, T, N, Dh)
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
        q = rope(self.wq(y).view(b, t, self.h, self.dh), cos, sin).transpose(1, 2)
        k = rope(self.wk(y).view(b, t, self.k, self.dh), cos, sin).transpose(1, 2)
        v = self.wv(y).view(b, t, self.k, self.dh).transpose(1, 2)
        k = k.repeat_interleave(self.h // self.k, dim=1)
        v = v.repeat_interleave(self.h // self.k, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.dh)
        att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(b, t, -1))
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
        self.register_buffer("cos", ang.cos()[None, :, None, :])
        self.register_buffer("sin", ang.sin()[None, :, None, :])

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.norm(x) @ self.embed.weight.T


def main() -> None:
    torch.manual_seed(0)
    model = opt = c = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "CONFIG":
            c = json.loads(arg)
            torch.set_num_threads(c["threads"])
            model = LM(c)
            decay = [q for q in model.parameters() if q.ndim >= 2]  # as marin: matrices only
            rest = [q for q in model.parameters() if q.ndim < 2]
            opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}],
                                    lr=c.get("lr", 1e-3), betas=tuple(c.get("betas", (0.9, 0.95))),
                                    eps=c.get("eps", 1e-8), weight_decay=c.get("weight_decay", 0.1))
            print("OK", flush=True)
        elif cmd == "RUN":
            steps, b, t = int(arg), c["batch_size"], c["seq_len"]
            x = torch.randint(0, c["vocab_size"], (b, t + 1))

            def step(model=model, opt=opt, x=x, c=c):
                logits = model(x[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), c.get("grad_clip", 1.0))
                opt.step()

            step()  # warm-up
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            print(f"{steps * b * t / (time.perf_counter() - t0):.1f}", flush=True)


if __name__ == "__main__":
    main()
