#!/usr/bin/env bash
# Runs the training-step benchmarks of tapir-nn (crates/nn/benches/nn_step.rs)
# and their PyTorch mirrors (benches/torch/mlp_step.py, gpt_step.py), then
# prints time per step and peak memory per step side by side, with the
# ratios torch / tapir for time (above 1: tapir is faster) and tapir / torch
# for peak memory (below 1: tapir needs less).
#
#   scripts/bench-nn.sh                               # both, then the table
#   TAPIR_BENCH_SKIP_RUST=1 scripts/bench-nn.sh       # reuse the last criterion run
#   TAPIR_BENCH_THREADS=1 scripts/bench-nn.sh         # both sides on N threads
#   TAPIR_BENCH_DEVICE=cuda scripts/bench-nn.sh       # both sides on CUDA device 0
#   TAPIR_BENCH_NN_BIN=gpu-bundle/bin/nn_step scripts/bench-nn.sh  # no cargo: a prebuilt bench
#
# Needs python3 with torch. Criterion's mean is read from
# target/criterion/nn_step/<id>/new/estimates.json and its fastest sample
# from sample.json; tapir's peak bytes are the exact allocator counts the
# bench prints before timing; torch's are exact too when a C compiler can
# build benches/torch/cpu_alloc_shim.c, preloaded to count PyTorch's CPU
# allocations (else a profiler lower bound; see benches/torch/nn_common.py).
# On a shared machine the best-of ratio is the steadier one: contention only
# ever adds time, and PyTorch's OpenMP threads suffer from it the most.
set -euo pipefail
cd "$(dirname "$0")/.."

TIME="${TAPIR_BENCH_TIME:-4}"
export TAPIR_BENCH_DEVICE="${TAPIR_BENCH_DEVICE:-cpu}"
THREADS_ARG=()
if [[ -n "${TAPIR_BENCH_THREADS:-}" ]]; then
    export RAYON_NUM_THREADS="$TAPIR_BENCH_THREADS"
    THREADS_ARG=(--threads "$TAPIR_BENCH_THREADS")
fi
RUST_OUT="$(mktemp)"
TORCH_OUT="$(mktemp)"
trap 'rm -f "$RUST_OUT" "$TORCH_OUT"' EXIT

if [[ -n "${TAPIR_BENCH_NN_BIN:-}" ]]; then
    # A prebuilt bench binary (scripts/gpu-prepare.sh's bin/nn_step, on a
    # machine without cargo); criterion writes under $CARGO_TARGET_DIR.
    echo "== tapir ($TAPIR_BENCH_NN_BIN --bench)" >&2
    "$TAPIR_BENCH_NN_BIN" --bench | tee "$RUST_OUT" >&2
elif [[ -z "${TAPIR_BENCH_SKIP_RUST:-}" ]]; then
    echo "== tapir (cargo bench -p tapir-nn --bench nn_step)" >&2
    cargo bench -p tapir-nn --bench nn_step | tee "$RUST_OUT" >&2
fi

SHIM_DIR="${CARGO_TARGET_DIR:-target}/bench-nn"
PRELOAD=""
if command -v cc >/dev/null 2>&1; then
    mkdir -p "$SHIM_DIR"
    cc -O2 -shared -fPIC -o "$SHIM_DIR/cpu_alloc_shim.so" benches/torch/cpu_alloc_shim.c -ldl -lpthread
    PRELOAD="$(cd "$SHIM_DIR" && pwd)/cpu_alloc_shim.so"
fi

echo "== torch (benches/torch/mlp_step.py, gpt_step.py)" >&2
for s in mlp_step gpt_step; do
    LD_PRELOAD="$PRELOAD" python3 "benches/torch/$s.py" --time "$TIME" --device "$TAPIR_BENCH_DEVICE" "${THREADS_ARG[@]}" 2>/dev/null | grep '^{' | tee -a "$TORCH_OUT" >&2
done

TARGET_DIR="${CARGO_TARGET_DIR:-target}" python3 - "$RUST_OUT" "$TORCH_OUT" <<'PY'
import json, os, sys

target = os.environ["TARGET_DIR"]
def lines(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            out[r["id"]] = r
    return out

tapir_mem, torch = lines(sys.argv[1]), lines(sys.argv[2])

def tapir_ns(bench_id):
    """(mean, fastest sample) ns per step, or None."""
    group, param = bench_id.split("/", 1)
    d = os.path.join(target, "criterion", group, param, "new")
    if not os.path.exists(os.path.join(d, "estimates.json")):
        return None
    mean = json.load(open(os.path.join(d, "estimates.json")))["mean"]["point_estimate"]
    s = json.load(open(os.path.join(d, "sample.json")))
    best = min(t / n for t, n in zip(s["times"], s["iters"]))
    return mean, best

mib = lambda b: f"{b / 2**20:7.2f} MiB"
print()
ms = lambda ns: f"{ns / 1e6:7.2f} ms"
print(f"{'step':12} {'tapir mean':>11} {'torch mean':>11} {'torch/tapir':>11} "
      f"{'tapir best':>11} {'torch best':>11} {'torch/tapir':>11}   "
      f"{'tapir peak':>12} {'torch peak':>12} {'tapir/torch':>11}")
for bench_id, r in torch.items():
    t = tapir_ns(bench_id)
    m = tapir_mem.get(bench_id)
    cols = [ms(t[0]), ms(r["ns"]), f"{r['ns'] / t[0]:10.2f}x", ms(t[1]), ms(r["min_ns"]),
            f"{r['min_ns'] / t[1]:10.2f}x"] if t else ["(none)", ms(r["ns"]), "", "", ms(r["min_ns"]), ""]
    peak = [mib(m["peak_bytes"]), mib(r["peak_bytes"]), f"{m['peak_bytes'] / r['peak_bytes']:10.2f}x"] \
        if m else ["(rerun)", mib(r["peak_bytes"]), ""]
    print(f"{bench_id:12} " + " ".join(f"{c:>11}" for c in cols) + "   " +
          " ".join(f"{c:>12}" for c in peak))
if torch:
    r = next(iter(torch.values()))
    print(f"\n(on {r.get('device', 'cpu')}; torch {r['torch']}, {r['threads']} threads, eager, peak memory {r['memory']}; "
          f"tapir {os.environ.get('RAYON_NUM_THREADS', str(os.cpu_count()) + ' (all)')} threads; times per step; "
          f"ratios above 1 for time mean tapir is faster, below 1 for memory that it needs less)")
PY
