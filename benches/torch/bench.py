"""PyTorch mirror of `tapir bench`: the same cases, shapes and seeds.

Prints {"torch_version": ..., "cases": {name: median milliseconds}}. With
--device cuda every tensor and network lives on the GPU (drawn on the CPU
first, so the seeds give the same values), times include a synchronize, and
peaks are torch.cuda.max_memory_allocated above the inputs.
"""
import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch

# Where the cases run; set from --device.
DEV = torch.device("cpu")


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize(DEV)


# Each case repeats at least `reps` times and for at least this long, as
# tapir's side does (MIN_SECONDS in crates/cli/src/bench.rs).
MIN_SECONDS = 0.3


def median_ms(reps, f):
    f()
    sync()
    ts = []
    start = time.perf_counter()
    while len(ts) < max(1, reps) or time.perf_counter() - start < MIN_SECONDS:
        s = time.perf_counter()
        f()
        sync()
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
    return torch.nn.Sequential(*layers).to(DEV)


def scalar_chain(reps):
    x = torch.tensor([0.5]).to(DEV).requires_grad_()

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
    x = torch.rand(1024, 2).to(DEV)
    params = list(net.parameters())
    return median_ms(reps, lambda: torch.autograd.grad(net(x).square().mean(), params))


def mlp_hvp(reps):
    net = mlp([2, 64, 64, 64, 1])
    torch.manual_seed(1)
    x = torch.rand(1024, 2).to(DEV)
    params = list(net.parameters())
    v = [torch.randn(p.shape).to(DEV) for p in params]

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
    x = torch.rand(1024, 2).to(DEV).requires_grad_()
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
    x = torch.randn(256, d).to(DEV).requires_grad_()
    return median_ms(reps, lambda: laplacian_nested(net, x).detach())


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def ce_inputs(n, v):
    torch.manual_seed(0)
    x = torch.empty(n, v).uniform_(-3, 3)  # in place: no temporaries before the baseline
    y = torch.randint(0, v, (n,))
    return x.to(DEV), y.to(DEV)


def ce_step(kind, x, y):
    x = x.detach().requires_grad_()
    if kind == "onehot_formula":
        # Seed 000: Keras's sparse categorical cross-entropy on the PyTorch backend.
        loss = -(torch.nn.functional.one_hot(y, x.shape[1]) * torch.log_softmax(x, -1)).sum(-1).mean()
    else:
        loss = torch.nn.functional.cross_entropy(x, y)
    loss.backward()
    return x.grad


def linear_ce_inputs(n, v, d, dtype=torch.float32):
    torch.manual_seed(0)
    h = torch.empty(n, d).normal_()
    w = torch.empty(v, d).normal_(0, 0.02)
    y = torch.randint(0, v, (n,))
    return h.to(DEV, dtype), w.to(DEV, dtype), y.to(DEV)


def linear_ce_step(h, w, y):
    h = h.detach().requires_grad_()
    w = w.detach().requires_grad_()
    torch.nn.functional.cross_entropy(h @ w.t(), y).backward()
    return h.grad, w.grad


CE_SHAPES = {"ce_4096x32000": (4096, 32000), "ce_8192x50257": (8192, 50257),
             # tapir runs these two on CUDA only.
             "ce_32768x32000": (32768, 32000), "ce_8192x128256": (8192, 128256)}
LINEAR_SHAPES = {"linear_ce_4096x32000x768": (4096, 32000, 768),
                 "linear_ce_8192x128256x4096_bf16": (8192, 128256, 4096, torch.bfloat16)}


def peak_child(name, kind):
    """Runs in a fresh process: peak resident bytes above the inputs."""
    if name in CE_SHAPES:
        x, y = ce_inputs(*CE_SHAPES[name])
        base = rss()
        ce_step(kind, x, y)
    else:
        h, w, y = linear_ce_inputs(*LINEAR_SHAPES[name])
        base = rss()
        linear_ce_step(h, w, y)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a
    # child would report its parent's peak; the high-water mark belongs to
    # this process's own address space.
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(hwm - base)


def cuda_peak(name, kind):
    """The allocator's peak above the inputs, in this process."""
    if name in CE_SHAPES:
        x, y = ce_inputs(*CE_SHAPES[name])
        step = lambda: ce_step(kind, x, y)
    else:
        h, w, y = linear_ce_inputs(*LINEAR_SHAPES[name])
        step = lambda: linear_ce_step(h, w, y)
    sync()
    base = torch.cuda.memory_allocated(DEV)
    torch.cuda.reset_peak_memory_stats(DEV)
    step()
    sync()
    return torch.cuda.max_memory_allocated(DEV) - base


def peak(name, kind):
    if DEV.type == "cuda":
        return cuda_peak(name, kind)
    out = subprocess.run([sys.executable, __file__, "--peak-child", name, "--kind", kind],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def ce_time(reps, name):
    x, y = ce_inputs(*CE_SHAPES[name])
    return median_ms(min(reps, 5), lambda: ce_step("cross_entropy", x, y))


def ce_onehot_time(reps, name):
    x, y = ce_inputs(*CE_SHAPES[name])
    return median_ms(min(reps, 3), lambda: ce_step("onehot_formula", x, y))


def linear_ce_time(reps, name):
    h, w, y = linear_ce_inputs(*LINEAR_SHAPES[name])
    return median_ms(min(reps, 3), lambda: linear_ce_step(h, w, y))


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
    "ce_4096x32000": lambda r: ce_time(r, "ce_4096x32000"),
    "ce_8192x50257": lambda r: ce_time(r, "ce_8192x50257"),
    "linear_ce_4096x32000x768": lambda r: linear_ce_time(r, "linear_ce_4096x32000x768"),
    "ce_32768x32000": lambda r: ce_time(r, "ce_32768x32000"),
    "ce_8192x128256": lambda r: ce_time(r, "ce_8192x128256"),
    "linear_ce_8192x128256x4096_bf16": lambda r: linear_ce_time(r, "linear_ce_8192x128256x4096_bf16"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="")
    ap.add_argument("--peak-child", default="")
    ap.add_argument("--kind", default="cross_entropy")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    global DEV
    DEV = torch.device(a.device)
    if DEV.type == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    if a.peak_child:
        peak_child(a.peak_child, a.kind)
        return
    names = [n for n in a.only.split(",") if n] or list(CASES)
    out = {"torch_version": torch.__version__, "device": str(DEV), "threads": torch.get_num_threads(), "cases": {},
           "peak_bytes": {}, "onehot_ms": {}}
    for n in names:
        if n not in CASES:
            print(f"unknown case {n}", file=sys.stderr)
            sys.exit(2)
        out["cases"][n] = CASES[n](a.reps)
        if n in CE_SHAPES:
            out["onehot_ms"][n] = ce_onehot_time(a.reps, n)
            out["peak_bytes"][n] = {k: peak(n, k) for k in ["F.cross_entropy", "onehot_formula"]}
        if n in LINEAR_SHAPES:
            out["peak_bytes"][n] = {"linear + F.cross_entropy": peak(n, "linear")}
        print(f"torch {n:<24} {out['cases'][n]:10.3f} ms", file=sys.stderr)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
