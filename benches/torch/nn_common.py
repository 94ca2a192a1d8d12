"""Shared timing and peak-memory helpers of the nn_step mirrors.

Timing: warm-up, then repeated steps for about `seconds`; mean and median
per step, as crates/nn/benches/nn_step.rs measures with criterion.

Peak memory: PyTorch has no allocator counters on the CPU. When the
process runs with benches/torch/cpu_alloc_shim.so preloaded (as
scripts/bench-nn.sh does), the shim counts exactly the bytes PyTorch's CPU
allocator holds, like torch.cuda.max_memory_allocated on a GPU: the peak
of one step, counted from before the model was made, is comparable with
tapir's exact figure. Without the shim, one step runs under torch.profiler
with profile_memory=True and the bytes each op allocates and frees (self,
not counting children) are summed in time order over the bytes already
live; an op's internal temporaries net to zero there, so that figure is a
lower bound. On CUDA (`--device cuda`) the peak is
torch.cuda.max_memory_allocated above the bytes live before the model. The
"memory" field says which one was used.
"""
import ctypes
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile


def bench(step, seconds, warmup=1.0):
    """(mean, median, min) seconds per call of step over about `seconds`."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    per_call = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(per_call) < 10:
        t0 = time.perf_counter()
        step()
        per_call.append(time.perf_counter() - t0)
    per_call.sort()
    return sum(per_call) / len(per_call), per_call[len(per_call) // 2], per_call[0]


def tensor_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def live_bytes(model, opt, batch):
    """Bytes live before a step: parameters, optimizer state and batch (the
    gradients were set to None)."""
    ts = list(model.parameters()) + list(batch)
    for st in opt.state.values():
        ts += [v for v in st.values() if torch.is_tensor(v)]
    return tensor_bytes(ts)


def peak_bytes(step, live):
    """live + the highest running sum of per-op allocations during one step."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return live + peak


def shim():
    """The preloaded allocator shim's counters, or None."""
    try:
        lib = ctypes.CDLL(None)
        live, peak, reset = lib.tapir_shim_live, lib.tapir_shim_peak, lib.tapir_shim_reset_peak
    except (OSError, AttributeError):
        return None
    live.restype = peak.restype = ctypes.c_longlong
    return live, peak, reset


def device(name):
    """The torch device `--device` names; exits 3 when it is CUDA and torch
    has none."""
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    return dev


def baseline(dev=torch.device("cpu")):
    """Bytes live before the model is made (0 on the CPU without the shim)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        return torch.cuda.memory_allocated(dev)
    s = shim()
    return s[0]() if s else 0


def report(name, step, model, opt, batch, seconds, base=0, dev=torch.device("cpu")):
    for _ in range(2):
        step()  # optimizer state exists from here on, as in a steady loop
    # Free the last step's gradients first (tapir's gradients are values
    # that die with the step too, and the profiler must see every byte it
    # counts being allocated).
    opt.zero_grad(set_to_none=True)
    counters = shim()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        live = torch.cuda.memory_allocated(dev) - base
        torch.cuda.reset_peak_memory_stats(dev)
        step()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        method = "exact (torch.cuda.max_memory_allocated)"
    elif counters:
        live_now, peak_now, reset = counters
        live = live_now() - base
        reset()
        step()
        peak = peak_now() - base
        method = "exact (allocator shim)"
    else:
        live = live_bytes(model, opt, batch)
        peak = peak_bytes(step, live)
        method = "profiler lower bound"
    mean, median, best = bench(step, seconds)
    print(
        json.dumps(
            {
                "id": name,
                "ns": mean * 1e9,
                "median_ns": median * 1e9,
                "min_ns": best * 1e9,
                "peak_bytes": peak,
                "live_bytes": live,
                "memory": method,
                "threads": torch.get_num_threads(),
                "device": str(dev),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
