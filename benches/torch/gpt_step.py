"""PyTorch mirror of nn_step/gpt in crates/nn/benches/nn_step.rs: one
training step of the `tapir gpt` default model, the same architecture
written the way a PyTorch user would (F.scaled_dot_product_attention with
is_causal, GELU tanh, tied head, F.cross_entropy), batch 64 x 9 tokens,
AdamW (lr 3e-3, betas 0.9/0.99, weight decay 0.1 except norms and biases),
gradient clipping at norm 1. Eager mode on the CPU (or --device cuda). Prints one JSON line.

Usage: python3 benches/torch/gpt_step.py [--time SECONDS] [--threads N] [--device cpu|cuda]
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from nn_common import baseline, device, report  # noqa: E402

VOCAB, BLOCK, D, LAYERS, HEADS, RATIO = 13, 16, 64, 2, 4, 4
BATCH, T = 64, 9


class Config:
    """The model's shape (the `tapir gpt` defaults unless given)."""

    def __init__(self, vocab=VOCAB, block=BLOCK, d=D, layers=LAYERS, heads=HEADS, ratio=RATIO):
        self.vocab, self.block, self.d, self.layers, self.heads, self.ratio = vocab, block, d, layers, heads, ratio


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.q, self.k, self.v, self.proj = (nn.Linear(cfg.d, cfg.d) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        split = lambda l: l(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(split(self.q), split(self.k), split(self.v), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(cfg.d), Attention(cfg), nn.LayerNorm(cfg.d)
        self.fc, self.proj = nn.Linear(cfg.d, cfg.ratio * cfg.d), nn.Linear(cfg.ratio * cfg.d, cfg.d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """`checkpoint`: each block under torch.utils.checkpoint (its
    activations recomputed in the backward), as `tapir gpt --checkpoint`."""

    def __init__(self, cfg=None, checkpoint=False):
        super().__init__()
        cfg = cfg or Config()
        self.vocab, self.checkpoint = cfg.vocab, checkpoint
        self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.d), nn.Embedding(cfg.block, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" not in name:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, self.vocab).float(), targets.view(-1))


def adamw(model):
    """AdamW as `tapir gpt` sets it: lr 3e-3, betas 0.9/0.99, weight decay
    0.1 except on norms and biases."""
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "ln" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "ln" in n]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.99),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dev = device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = baseline(dev)
    model = Gpt().to(dev)
    opt = adamw(model)
    x = torch.randint(0, VOCAB, (BATCH, T)).to(dev)
    y = torch.randint(0, VOCAB, (BATCH, T)).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    report("nn_step/gpt", step, model, opt, (x, y), args.time, base, dev)


if __name__ == "__main__":
    main()
