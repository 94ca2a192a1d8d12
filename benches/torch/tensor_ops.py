"""PyTorch mirror of crates/tensor/benches/tensor_ops.rs: the same ops on
the same shapes and dtypes, timed the same way (warm-up, then repeated
calls whose result is dropped each time), so scripts/bench-tensor.sh can
print tapir / torch throughput ratios.

Prints one JSON object per line:
  {"id": "matmul_f32/1024", "ns": <mean ns per call>, "median_ns": ...,
   "elements": <work per call>, ...}
where "elements" matches the criterion Throughput of the Rust bench
(2 n^3 FLOPs for matmul, elements for the rest).

Usage: python3 benches/torch/tensor_ops.py [--time SECONDS] [--threads N] [--only ID]
                                            [--interleave LIB --pairs N]

With --interleave, LIB is tapir's benches/ffi library
(target/release/libtapir_bench_ffi.so): each case then runs N pairs in this
one process, tapir's kernel (through ctypes) and torch's back to back, and
the line adds "tapir_ns" and "torch_ns" (one per pair) and "ratio", the
median of the pairs' tapir/torch throughput ratios.
"""

import argparse
import ctypes
import json
import statistics
import time

import torch


def bench(fn, seconds, warmup=1.0):
    """(mean, median) seconds per call of fn over about `seconds` of calls."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        fn()
    per_call = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(per_call) < 10:
        t0 = time.perf_counter()
        fn()
        per_call.append(time.perf_counter() - t0)
    per_call.sort()
    return sum(per_call) / len(per_call), per_call[len(per_call) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default=None, help="run just the benchmark with this id")
    ap.add_argument("--interleave", default=None, help="tapir's libtapir_bench_ffi.so: time both sides here")
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cases = []
    for n in (256, 1024, 2048):
        a = torch.randn(n, n, dtype=torch.float32)
        b = torch.randn(n, n, dtype=torch.float32)
        cases.append((f"matmul_f32/{n}", 2 * n**3, lambda a=a, b=b: torch.matmul(a, b)))
    elems = 1 << 24
    a = torch.randn(elems, dtype=torch.float32)
    b = torch.randn(elems, dtype=torch.float32)
    cases.append(("add_f32/16M", elems, lambda: torch.add(a, b)))
    cases.append(("exp_f32/16M", elems, lambda: torch.exp(a)))
    x = torch.randn(4096, 4096, dtype=torch.float32)
    cases.append(("sum_last_axis_f32/4096x4096", x.numel(), lambda: x.sum(dim=-1)))

    with torch.inference_mode():
        for name, work, fn in cases:
            if args.only is not None and name != args.only:
                continue
            if args.interleave is not None:
                interleave(args, name, work, fn)
                continue
            mean, median = bench(fn, args.time)
            print(
                json.dumps(
                    {
                        "id": name,
                        "ns": mean * 1e9,
                        "median_ns": median * 1e9,
                        "elements": work,
                        "threads": torch.get_num_threads(),
                        "torch": torch.__version__,
                    }
                ),
                flush=True,
            )


def interleave(args, name, work, fn):
    """Pairs of tapir then torch, back to back in this process."""
    lib = ctypes.CDLL(args.interleave)
    lib.tapir_bench_mean_ns.restype = ctypes.c_double
    lib.tapir_bench_mean_ns.argtypes = [ctypes.c_char_p, ctypes.c_double]
    tapir_ns, torch_ns = [], []
    bench(fn, 0.2, warmup=0.2)  # torch's own warm-up
    for _ in range(args.pairs):
        t = lib.tapir_bench_mean_ns(name.encode(), args.time)
        if t < 0:
            raise SystemExit(f"tapir does not know the benchmark {name}")
        # Let each side's spinning threads park before the other runs.
        time.sleep(0.05)
        mean, _ = bench(fn, args.time, warmup=0.05)
        time.sleep(0.05)
        tapir_ns.append(t)
        torch_ns.append(mean * 1e9)
    ratios = [o / t for t, o in zip(tapir_ns, torch_ns)]
    print(
        json.dumps(
            {
                "id": name,
                "elements": work,
                "tapir_ns": tapir_ns,
                "torch_ns": torch_ns,
                "ratio": statistics.median(ratios),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
