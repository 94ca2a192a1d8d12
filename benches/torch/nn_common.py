"""Shared timing and peak-memory helpers of the nn_step mirrors.

Timing: warm-up, then repeated steps for about `seconds`; mean and median
per step, as crates/nn/benches/nn_step.rs measures with criterion.

Peak memory: PyTorch has no allocator counters on the CPU, so one step runs
under torch.profiler with profile_memory=True and the bytes each op
allocates and frees (self, not counting children) are summed in time order
over the bytes already live (parameters, optimizer state, batch). A
temporary that an op allocates and frees inside itself nets to zero there,
so this is a lower bound of torch's true peak: a tapir peak at or below it
is at or below torch's.
"""
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile


def bench(step, seconds, warmup=1.0):
    """(mean, median) seconds per call of step over about `seconds`."""
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
    return sum(per_call) / len(per_call), per_call[len(per_call) // 2]


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


def report(name, step, model, opt, batch, seconds):
    for _ in range(2):
        step()  # optimizer state exists from here on, as in a steady loop
    # Free the last step's gradients before profiling, so the profiler sees
    # every byte it counts being allocated (tapir's gradients are values
    # that die with the step too).
    opt.zero_grad(set_to_none=True)
    live = live_bytes(model, opt, batch)
    peak = peak_bytes(step, live)
    mean, median = bench(step, seconds)
    print(
        json.dumps(
            {
                "id": name,
                "ns": mean * 1e9,
                "median_ns": median * 1e9,
                "peak_bytes": peak,
                "live_bytes": live,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
