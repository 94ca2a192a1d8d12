"""PyTorch mirror of `tapir memcheck`: the same scenarios, sizes and seeds.

Prints one JSON document on stdout. On CUDA (--device cuda) the figures are
torch.cuda.memory_allocated / max_memory_allocated; on the CPU they are the
process's resident set size (sampled at the boundaries and at points inside
each iteration), which differs in kind from tapir's exact allocator count.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

PAGE = os.sysconf("SC_PAGE_SIZE")


class Meter:
    def __init__(self, device):
        # "cuda" or "cuda:N" both measure the GPU's allocator.
        self.device = "cuda" if str(device).startswith("cuda") else "cpu"
        self.index = torch.device(device)
        self.live, self.peak, self.kept = [], [], []
        self._peak = 0

    def now(self):
        if self.device == "cuda":
            torch.cuda.synchronize(self.index)
            return torch.cuda.memory_allocated(self.index)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE

    def sample(self):
        """A point inside an iteration (CPU peak is sampled, not exact)."""
        self._peak = max(self._peak, self.now())

    def begin(self):
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats(self.index)
        self._peak = self.now()

    def end(self, kept=0):
        live = self.now()
        if self.device == "cuda":
            peak = torch.cuda.max_memory_allocated(self.index)
        else:
            peak = max(self._peak, live)
        self.live.append(live)
        self.peak.append(peak)
        self.kept.append(kept)

    def result(self, **extra):
        return dict(live=self.live, peak=self.peak, kept=self.kept, **extra)


def scaled(base, size):
    return max(1, round(base * size))


def mlp(widths, act):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(act())
    return torch.nn.Sequential(*layers)


def create_graph_cycle(m, size, iters, dev):
    torch.manual_seed(3)
    x = torch.randn(scaled(200_000, size), device=dev, requires_grad=True)
    for _ in range(iters):
        m.begin()
        y = torch.tanh(x)
        y.backward(torch.ones_like(y), create_graph=True)  # x.grad now holds a graph
        m.sample()
        m.end()
    return m.result()


def pinn_create_graph(m, size, iters, dev):
    torch.manual_seed(11)
    net = mlp([2, 64, 64, 1], torch.nn.Tanh).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    pts = torch.rand(scaled(512, size), 2, device=dev, requires_grad=True)
    for _ in range(iters):
        m.begin()
        u = net(pts)
        du = torch.autograd.grad(u.sum(), pts, create_graph=True)[0]
        lap = 0
        for i in range(2):
            lap = lap + torch.autograd.grad(du[:, i].sum(), pts, create_graph=True)[0][:, i]
        loss = ((lap + 1) ** 2).mean()
        loss.backward(create_graph=True)
        m.sample()
        opt.step()
        for p in net.parameters():
            p.grad = None  # reset the parameters' grads; pts.grad still holds a graph
        m.end()
    return m.result()


def returned_second_derivative(m, size, iters, dev):
    torch.manual_seed(5)
    x0 = torch.randn(scaled(100_000, size), device=dev)

    def d2(x0):
        x = x0.clone().requires_grad_()
        dy = torch.autograd.grad(torch.tanh(x).sum(), x, create_graph=True)[0]
        return torch.autograd.grad(dy.sum(), x, create_graph=True)[0]

    kept = []
    for _ in range(iters):
        m.begin()
        kept.append(d2(x0))
        m.end(kept=sum(t.numel() * 4 for t in kept))
    return m.result()


def accumulated_loss(m, size, iters, dev):
    torch.manual_seed(7)
    b, d = scaled(256, size), 512
    net = mlp([d, d, 1], torch.nn.ReLU).to(dev)
    total_loss = 0
    for i in range(iters):
        m.begin()
        torch.manual_seed(100 + i)
        x = torch.randn(b, d, device=dev)
        loss = net(x).square().mean()
        loss.backward()
        net.zero_grad()
        total_loss += loss  # keeps each step's autograd history
        m.end()
    return m.result()


def eager_graph_growth(m, size, iters, dev):
    torch.manual_seed(9)
    b, d = scaled(256, size), 512
    net = mlp([d, d, d, 10], torch.nn.ReLU).to(dev)
    outputs = []
    for i in range(iters):
        m.begin()
        torch.manual_seed(1000 + i)
        outputs.append(net(torch.randn(b, d, device=dev)))  # each keeps its graph
        m.end(kept=sum(t.numel() * 4 for t in outputs))
    return m.result()


def onehot_cross_entropy(m, size, iters, dev):
    torch.manual_seed(13)
    n, v = scaled(1024, size), 32_000
    x0 = (torch.rand(n, v, device=dev) * 6 - 3)
    y = torch.randint(0, v, (n,), device=dev)
    iters = min(iters, 10)

    def run(kind):
        mm = Meter(dev)
        for _ in range(iters):
            mm.begin()
            x = x0.clone().requires_grad_()
            base = mm.now()
            if kind == "onehot":
                loss = -(F.one_hot(y, v) * F.log_softmax(x, -1)).sum(-1).mean()
            else:
                loss = F.cross_entropy(x, y)
            mm.sample()
            loss.backward()
            mm.sample()
            del x, loss
            mm.end()
        return mm

    onehot = run("onehot")
    ce = run("cross_entropy")
    variants = {}
    for name, mm in [("onehot_formula", onehot), ("F.cross_entropy", ce)]:
        start = mm.live[0]
        variants[name] = {"peak_over_start_bytes": max(p - start for p in mm.peak),
                          "peak": mm.peak, "live": mm.live}
    r = ce.result(variants=variants)
    return r


def hessian_optimizer_loop(m, size, iters, dev):
    torch.manual_seed(17)
    n = scaled(200_000, size)
    a = torch.randn(n, device=dev)
    p = torch.randn(n, device=dev, requires_grad=True)
    v = torch.randn(n, device=dev)
    for _ in range(iters):
        m.begin()
        loss = torch.tanh(a * p).square().sum()
        loss.backward(create_graph=True)  # never zeroed: p.grad keeps growing a graph
        hv = torch.autograd.grad(p.grad @ v, p, retain_graph=True)[0]
        m.sample()
        with torch.no_grad():
            p -= 1e-3 * hv
        m.end()
    return m.result()


SCENARIOS = {f.__name__: f for f in [
    create_graph_cycle, pinn_create_graph, returned_second_derivative, accumulated_loss,
    eager_graph_growth, onehot_cross_entropy, hessian_optimizer_loop,
]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    on_cuda = a.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    names = [n for n in a.only.split(",") if n] or list(SCENARIOS)
    out = {
        "torch_version": torch.__version__,
        "device": a.device,
        "measure": ("torch.cuda.memory_allocated / max_memory_allocated" if on_cuda
                    else "process resident set size (RSS), sampled"),
        "scenarios": {},
    }
    for name in names:
        if name not in SCENARIOS:
            print(f"unknown scenario {name}", file=sys.stderr)
            sys.exit(2)
        print(f"torch: {name} ...", file=sys.stderr)
        out["scenarios"][name] = SCENARIOS[name](Meter(a.device), a.size, a.iters, a.device)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
