"""PyTorch mirror of nn_step/mlp in crates/nn/benches/nn_step.rs: one
training step of an MLP 784-1024-1024-10 (ReLU), batch 256, cross-entropy,
plain SGD (lr 0.01), in eager mode on the CPU (or --device cuda). Prints one JSON line.

Usage: python3 benches/torch/mlp_step.py [--time SECONDS] [--threads N] [--device cpu|cuda]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from nn_common import baseline, device, report  # noqa: E402


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
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 784).to(dev)
    y = torch.randint(0, 10, (256,)).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    report("nn_step/mlp", step, model, opt, (x, y), args.time, base, dev)


if __name__ == "__main__":
    main()
