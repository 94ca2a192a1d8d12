"""tapir's CUDA kernels beside PyTorch's on one GPU, in one process.

The H200 targets of the CUDA backend: f32 and bf16 matmul at 4,096 at
least 0.9x PyTorch's throughput; a large elementwise op and a reduction at
least 80% of the device's copy bandwidth (measured here as torch's
`dst.copy_(src)`); zero driver allocations per step after warm-up.

tapir's side is benches/ffi (target/release/libtapir_bench_ffi.so), called
through ctypes; each case runs N pairs, tapir then torch back to back, both
timed the same way (a warm-up call, then calls for about --time seconds,
the device synchronized every 16 calls and at the end).

Prints one JSON object per case, then a summary line per target:
  {"id": "cuda/matmul_f32/4096", "work": ..., "unit": "FLOP" | "byte",
   "tapir_ns": [...], "torch_ns": [...], "ratio": <median tapir/torch
   throughput>, "tapir_per_s": ..., "torch_per_s": ...,
   "copy_fraction": <tapir bytes/s over torch's copy bandwidth>,
   "tapir_driver_allocs": <in the last timed loop>}

Usage: python3 benches/torch/cuda_ops.py LIB [--pairs N] [--time S] [--only ID]

TAPIR_BENCH_SMALL=1 shrinks every size (each dimension / 256, at least 4),
in tapir's library too, so the harness can be checked on the emulated
device; torch then runs on the CPU when it has no CUDA, and the figures
mean nothing (the emulator measures correctness, never speed).
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

SMALL = os.environ.get("TAPIR_BENCH_SMALL") == "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def dims(size):
    ds = [int(d) for d in size.split("x")]
    return [max(d // 256, 4) for d in ds] if SMALL else ds


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def bench(fn, seconds):
    """Mean seconds per call over about `seconds` of calls."""
    fn()
    sync()
    calls, t0 = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
        if calls % 16 == 0:
            sync()
    sync()
    return (time.perf_counter() - t0) / calls


def cases():
    g = torch.Generator(device=DEV).manual_seed(7)
    out = []
    for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        (n,) = dims("4096")
        a = torch.randn(n, n, device=DEV, generator=g).to(dt)
        b = torch.randn(n, n, device=DEV, generator=g).to(dt)
        out.append((f"cuda/matmul_{name}/4096", 2 * n**3, "FLOP", lambda a=a, b=b: torch.matmul(a, b)))
    (n,) = dims("268435456")
    x = torch.randn(n, device=DEV, generator=g)
    y = torch.randn(n, device=DEV, generator=g)
    out.append(("cuda/add_f32/268435456", 3 * 4 * n, "byte", lambda: torch.add(x, y)))
    out.append(("cuda/exp_f32/268435456", 2 * 4 * n, "byte", lambda: torch.exp(x)))
    r, c = dims("16384x16384")
    m = torch.randn(r, c, device=DEV, generator=g)
    out.append(("cuda/sum_last_axis_f32/16384x16384", 4 * r * c + 4 * r, "byte", lambda: m.sum(dim=-1)))
    out.append(("cuda/transpose_copy_f32/16384x16384", 2 * 4 * r * c, "byte", lambda: m.t().contiguous()))
    return out, (x, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--time", type=float, default=1.0)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # tapir keeps TF32 off too
    lib = ctypes.CDLL(args.lib)
    lib.tapir_bench_cuda_mean_ns.restype = ctypes.c_double
    lib.tapir_bench_cuda_mean_ns.argtypes = [ctypes.c_char_p, ctypes.c_double]
    lib.tapir_bench_cuda_system_allocs.restype = ctypes.c_uint64
    if DEV != "cuda":
        print(f"note: torch {torch.__version__} has no CUDA here; its side runs on the CPU", file=sys.stderr)

    with torch.inference_mode():
        all_cases, (x, _) = cases()
        dst = torch.empty_like(x)
        copy_bw = 2 * 4 * x.numel() / bench(lambda: dst.copy_(x), args.time)
        print(json.dumps({"id": "torch_copy_bandwidth", "bytes_per_s": copy_bw, "device": DEV}), flush=True)
        failed = False
        for name, work, unit, fn in all_cases:
            if args.only is not None and name != args.only:
                continue
            tapir_ns, torch_ns = [], []
            for _ in range(args.pairs):
                t = lib.tapir_bench_cuda_mean_ns(name.encode(), args.time)
                if t < 0:
                    print(json.dumps({"id": name, "error": "tapir failed or has no CUDA device"}), flush=True)
                    failed = True
                    break
                tapir_ns.append(t)
                torch_ns.append(bench(fn, args.time) * 1e9)
            if not tapir_ns:
                continue
            t_med, o_med = statistics.median(tapir_ns), statistics.median(torch_ns)
            rec = {
                "id": name,
                "work": work,
                "unit": unit,
                "tapir_ns": tapir_ns,
                "torch_ns": torch_ns,
                "ratio": statistics.median(o / t for t, o in zip(tapir_ns, torch_ns)),
                "tapir_per_s": work / (t_med * 1e-9),
                "torch_per_s": work / (o_med * 1e-9),
                "tapir_driver_allocs": lib.tapir_bench_cuda_system_allocs(),
                "small": SMALL,
                "torch_device": DEV,
            }
            if unit == "byte":
                rec["copy_fraction"] = rec["tapir_per_s"] / copy_bw
            print(json.dumps(rec), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
