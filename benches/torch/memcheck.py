"""PyTorch mirror of `tapir memcheck`: the same scenarios, sizes and seeds.

Prints one JSON document on stdout. On CUDA (--device cuda) the figures are
torch.cuda.memory_allocated / max_memory_allocated; on the CPU they are the
process's resident set size (sampled at the boundaries and at points inside
each iteration), which differs in kind from tapir's exact allocator count.
"""
import argparse
import json
import math
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


# Memory at training scale (`tapir memcheck --scenario attention|checkpoint|amp`):
# one step's peak above the bytes live before it, the bytes it leaves live,
# and its median time, per variant.

def _counters(dev):
    """(now, reset_peak, peak, how) for this device: torch.cuda's counters,
    or the preloaded allocator shim's on the CPU (None without it)."""
    if dev.type == "cuda":
        def now():
            torch.cuda.synchronize(dev)
            return torch.cuda.memory_allocated(dev)
        return (now, lambda: torch.cuda.reset_peak_memory_stats(dev),
                lambda: torch.cuda.max_memory_allocated(dev), "torch.cuda.max_memory_allocated (exact)")
    from nn_common import shim
    s = shim()
    if s is None:
        return None
    live, peak, reset = s
    return live, reset, peak, "allocator shim (exact bytes of PyTorch's CPU allocator)"


def _figure(dev, step, reps, before=None):
    """Peak above the live bytes before one step, live bytes it leaves, and
    the median seconds of `reps` more after a warm-up step (reps 0: the one
    step measured for bytes, timed too)."""
    import time

    def timed():
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        took = time.perf_counter() - t0
        if before:
            before()
        return took

    if reps > 0:
        timed()
    c = _counters(dev)
    peak = live = None
    if c:
        now, reset, peak_fn, _ = c
        base = now()
        reset()
        first = timed()
        peak, live = peak_fn() - base, now() - base
    else:
        first = timed()
    times = sorted(timed() for _ in range(reps)) or [first]
    return {"peak_bytes": peak, "live_bytes": live, "seconds": times[len(times) // 2], "times": times}


def scale_attention(dev, a):
    """Causal attention forward and backward on q, k, v [B, T, C]: eager
    (scores, mask, softmax, matmul) and F.scaled_dot_product_attention,
    in --dtype (q, k, v and the output's gradient drawn in f32 and cast)."""
    b, h, d = a.batch, a.heads, a.head_dim
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    out = {}
    for t in a.t:
        torch.manual_seed(0)
        q, k, v, g = (torch.randn(b, t, h * d, device=dev).to(dtype) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_()
        mask = None

        def run(kind):
            def split(x):
                return x.view(b, t, h, d).transpose(1, 2)
            qh, kh, vh = split(q), split(k), split(v)
            if kind == "eager":
                s = (qh @ kh.transpose(-2, -1)) / math.sqrt(d)
                s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=dev).triu(1), float("-inf"))
                y = torch.softmax(s, -1) @ vh
            else:
                y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, h * d)
            (y * g).sum().backward()

        def clear():
            for x in (q, k, v):
                x.grad = None

        row = {}
        for kind in ("eager", "sdpa"):
            if kind == "eager" and t > a.eager_max_t:
                row[kind] = {"skipped": f"T > --eager-max-t {a.eager_max_t}"}
                continue
            print(f"torch: attention {kind} T={t} ...", file=sys.stderr)
            row[kind] = _figure(dev, lambda: run(kind), a.reps, clear)
        del mask
        out[str(t)] = row
    return out


def scale_gpt(dev, a, variants):
    """One training step (forward, backward, AdamW) of the `tapir gpt`
    model (benches/torch/gpt_step.py's, at the shape given) per variant:
    "plain", "checkpoint" (torch.utils.checkpoint per block), "bf16"
    (torch.autocast(dtype=torch.bfloat16))."""
    from gpt_step import Config, Gpt, adamw
    cfg = Config(vocab=a.vocab, block=a.gpt_t, d=a.d_model, layers=a.layers, heads=a.heads, ratio=4)
    out = {}
    for name in variants:
        torch.manual_seed(0)
        model = Gpt(cfg, checkpoint=(name == "checkpoint")).to(dev)
        opt = adamw(model)
        x = torch.randint(0, a.vocab, (a.gpt_batch, a.gpt_t), device=dev)
        y = torch.randint(0, a.vocab, (a.gpt_batch, a.gpt_t), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            if name == "bf16":
                with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                    loss = model(x, y)
            else:
                loss = model(x, y)
            loss.backward()
            opt.step()
            return loss.item()

        print(f"torch: gpt step {name} ...", file=sys.stderr)
        out[name] = _figure(dev, step, a.reps, lambda: opt.zero_grad(set_to_none=True))
        del model, opt
    return out


SCALE = {
    "attention": scale_attention,
    "checkpoint": lambda dev, a: scale_gpt(dev, a, ["plain", "checkpoint"]),
    "amp": lambda dev, a: scale_gpt(dev, a, ["plain", "bf16"]),
}


def scale_main(a):
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    if a.threads:
        torch.set_num_threads(a.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    c = _counters(dev)
    out = {
        "torch_version": torch.__version__,
        "device": a.device,
        "threads": torch.get_num_threads(),
        "measure": c[3] if c else "none (run with benches/torch/cpu_alloc_shim.so preloaded for exact CPU bytes)",
        "scenarios": {},
    }
    for name in a.scenario.split(","):
        out["scenarios"][name] = SCALE[name](dev, a)
    json.dump(out, sys.stdout)


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
    # The scale scenarios (attention, checkpoint, amp) and their shapes.
    ap.add_argument("--scenario", default="")
    ap.add_argument("--t", default="1024", help="attention's sequence lengths, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"], help="attention's dtype")
    ap.add_argument("--eager-max-t", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--gpt-t", type=int, default=256)
    ap.add_argument("--gpt-batch", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    if a.scenario:
        a.t = [int(x) for x in a.t.split(",") if x]
        scale_main(a)
        return
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
