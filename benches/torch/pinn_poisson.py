"""PyTorch mirror of `tapir pinn poisson`: same network, points, loss and
schedule (nested autograd for the Laplacian). Prints the relative L2 error
on the 101 x 101 grid every --eval-every steps.

    python3 benches/torch/pinn_poisson.py --steps 10000
"""
import argparse
import math
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--init", default="xavier", choices=["xavier", "torch"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    layers = []
    widths = [2, 64, 64, 64, 1]
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        if a.init == "xavier":
            torch.nn.init.xavier_normal_(lin.weight)
            torch.nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i + 2 < len(widths):
            layers.append(torch.nn.Tanh())
    net = torch.nn.Sequential(*layers)
    xi = torch.rand(2000, 2, requires_grad=True)
    s = torch.rand(400)
    side = torch.arange(400) % 4
    zero, one = torch.zeros(400), torch.ones(400)
    bx = torch.where(side == 0, s, torch.where(side == 1, zero, torch.where(side == 2, one, s)))
    by = torch.where(side == 0, zero, torch.where(side == 3, one, s))
    xb = torch.stack([bx, by], 1)
    f = 2 * math.pi ** 2 * torch.sin(math.pi * xi[:, 0].detach()) * torch.sin(math.pi * xi[:, 1].detach())
    g = torch.linspace(0, 1, 101)
    gy, gx = torch.meshgrid(g, g, indexing="ij")
    grid = torch.stack([gx.reshape(-1), gy.reshape(-1)], 1)
    exact = torch.sin(math.pi * grid[:, 0]) * torch.sin(math.pi * grid[:, 1])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.1 ** min(k / a.steps, 1.0))
    t0 = time.time()
    for step in range(a.steps):
        u = net(xi)
        du = torch.autograd.grad(u.sum(), xi, create_graph=True)[0]
        lap = sum(torch.autograd.grad(du[:, i].sum(), xi, create_graph=True)[0][:, i] for i in range(2))
        loss = (lap + f).square().mean() + net(xb).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % a.eval_every == 0:
            with torch.no_grad():
                err = ((net(grid).squeeze(1) - exact).norm() / exact.norm()).item()
            print(f"torch adam {step + 1:>6}  loss {loss.item():.3e}  rel L2 {err:.3e}  ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
