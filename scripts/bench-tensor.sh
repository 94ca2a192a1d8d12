#!/usr/bin/env bash
# Runs the tapir-tensor CPU benchmarks and their PyTorch mirror on the same
# shapes, then prints each one's throughput and the ratio tapir / torch
# (above 1 means tapir is faster).
#
#   scripts/bench-tensor.sh                  # every benchmark
#   scripts/bench-tensor.sh matmul_f32/1024  # some of them
#
# Each benchmark runs in tapir and then at once in torch, so a machine whose
# load drifts affects both sides of a ratio alike. Needs python3 with torch.
# Criterion's result is read from
# target/criterion/<group>/<id>/new/estimates.json (mean time per call);
# the torch mirror reports its mean the same way.
set -euo pipefail
cd "$(dirname "$0")/.."

IDS=("$@")
if [[ ${#IDS[@]} -eq 0 ]]; then
    IDS=(matmul_f32/256 matmul_f32/1024 matmul_f32/2048 add_f32/16M exp_f32/16M sum_last_axis_f32/4096x4096)
fi
TIME="${TAPIR_BENCH_TIME:-3}"
TORCH_OUT="$(mktemp)"
trap 'rm -f "$TORCH_OUT"' EXIT

cargo bench -p tapir-tensor --bench tensor_ops --no-run >&2
for id in "${IDS[@]}"; do
    echo "== $id" >&2
    cargo bench -q -p tapir-tensor --bench tensor_ops -- "^${id}\$" >&2
    python3 benches/torch/tensor_ops.py --time "$TIME" --only "$id" | tee -a "$TORCH_OUT" >&2
done

TARGET_DIR="${CARGO_TARGET_DIR:-target}" python3 - "$TORCH_OUT" <<'PY'
import json, os, sys

target = os.environ["TARGET_DIR"]
torch = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        r = json.loads(line)
        torch[r["id"]] = r

def tapir_ns(bench_id):
    group, param = bench_id.split("/", 1)
    path = os.path.join(target, "criterion", group, param, "new", "estimates.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))["mean"]["point_estimate"]

def fmt(work, ns, unit):
    return f"{work / ns:8.2f} {unit}"  # work per ns = G work per s

print()
print(f"{'benchmark':32} {'tapir':>16} {'torch':>16} {'tapir/torch':>12}")
for bench_id, r in torch.items():
    unit = "GFLOP/s" if bench_id.startswith("matmul") else "Gelem/s"
    t_ns = tapir_ns(bench_id)
    if t_ns is None:
        print(f"{bench_id:32} {'(no result)':>16} {fmt(r['elements'], r['ns'], unit):>16}")
        continue
    print(
        f"{bench_id:32} {fmt(r['elements'], t_ns, unit):>16} "
        f"{fmt(r['elements'], r['ns'], unit):>16} {r['ns'] / t_ns:11.2f}x"
    )
if torch:
    r = next(iter(torch.values()))
    print(f"\n(torch {r['torch']}, {r['threads']} threads; tapir on its helper pool (RAYON_NUM_THREADS sets its size); "
          f"{os.cpu_count()} CPUs, load average {open('/proc/loadavg').read().split()[0]})")
PY
