"""PyTorch mirror of `tapir bench`: the same cases, shapes and seeds.

Prints {"torch_version": ..., "cases": {name: median milliseconds}}.
"""
import argparse
import json
import math
import sys
import time

import torch


def median_ms(reps, f):
    f()
    ts = []
    for _ in range(max(1, reps)):
        s = time.perf_counter()
        f()
        ts.append((time.perf_counter() - s) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def mlp(widths, seed=0):
    torch.manual_seed(seed)
    layers = []
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        torch.nn.init.xavier_normal_(lin.weight)
        torch.nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i + 2 < len(widths):
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def scalar_chain(reps):
    x = torch.tensor([0.5], requires_grad=True)

    def run():
        y = x
        for i in range(10_000):
            k = i % 4
            if k == 0:
                y = y * 1.0001
            elif k == 1:
                y = y + 1e-4
            elif k == 2:
                y = ((y * x) * 0.5 + y) * 0.6
            else:
                y = torch.tanh(y)
        torch.autograd.grad(y.sum(), x)
    return median_ms(reps, run)


def mlp_grad(reps):
    net = mlp([2, 64, 64, 64, 1])
    torch.manual_seed(1)
    x = torch.rand(1024, 2)
    params = list(net.parameters())
    return median_ms(reps, lambda: torch.autograd.grad(net(x).square().mean(), params))


def mlp_hvp(reps):
    net = mlp([2, 64, 64, 64, 1])
    torch.manual_seed(1)
    x = torch.rand(1024, 2)
    params = list(net.parameters())
    v = [torch.randn_like(p) for p in params]

    def run():
        loss = net(x).square().mean()
        gs = torch.autograd.grad(loss, params, create_graph=True)
        dot = sum((g * vi).sum() for g, vi in zip(gs, v))
        torch.autograd.grad(dot, params)
    return median_ms(reps, run)


def laplacian_nested(net, x):
    d = x.shape[1]
    u = net(x)
    du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
    lap = 0
    for i in range(d):
        lap = lap + torch.autograd.grad(du[:, i].sum(), x, create_graph=True)[0][:, i]
    return lap


def poisson_step(reps):
    net = mlp([2, 64, 64, 64, 1])
    torch.manual_seed(1)
    x = torch.rand(1024, 2, requires_grad=True)
    f = torch.sin(math.pi * x[:, 0].detach())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def run():
        opt.zero_grad(set_to_none=True)
        loss = (laplacian_nested(net, x) + f).square().mean()
        loss.backward()
        opt.step()
    return median_ms(reps, run)


def laplacian(reps, d):
    net = mlp([d, 128, 128, 128, 1])
    torch.manual_seed(1)
    x = torch.randn(256, d, requires_grad=True)
    return median_ms(reps, lambda: laplacian_nested(net, x).detach())


CASES = {
    "scalar_chain": scalar_chain,
    "mlp_grad": mlp_grad,
    "mlp_hvp": mlp_hvp,
    "poisson_step": poisson_step,
    "laplacian_d10": lambda r: laplacian(r, 10),
    "laplacian_d100": lambda r: laplacian(r, 100),
    # PyTorch has one exact method here; the nested rows compare the same thing.
    "laplacian_d10_nested": lambda r: laplacian(r, 10),
    "laplacian_d100_nested": lambda r: laplacian(r, 100),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(CASES)
    out = {"torch_version": torch.__version__, "threads": torch.get_num_threads(), "cases": {}}
    for n in names:
        if n not in CASES:
            print(f"unknown case {n}", file=sys.stderr)
            sys.exit(2)
        out["cases"][n] = CASES[n](a.reps)
        print(f"torch {n:<24} {out['cases'][n]:10.3f} ms", file=sys.stderr)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
