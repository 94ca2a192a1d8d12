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
"""

import argparse
import json
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


if __name__ == "__main__":
    main()
