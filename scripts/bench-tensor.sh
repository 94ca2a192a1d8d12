#!/usr/bin/env bash
# Runs the tapir-tensor CPU benchmarks and their PyTorch mirror on the same
# shapes, then prints each one's throughput and the ratio tapir / torch
# (above 1 means tapir is faster).
#
#   scripts/bench-tensor.sh            # both, then the table
#   TAPIR_BENCH_SKIP_RUST=1 scripts/bench-tensor.sh   # reuse the last criterion run
#
# Needs python3 with torch. Criterion's results are read from
# target/criterion/<group>/<id>/new/estimates.json (mean time per call).
set -euo pipefail
cd "$(dirname "$0")/.."

TIME="${TAPIR_BENCH_TIME:-3}"
TORCH_OUT="$(mktemp)"
trap 'rm -f "$TORCH_OUT"' EXIT

if [[ -z "${TAPIR_BENCH_SKIP_RUST:-}" ]]; then
    echo "== tapir (cargo bench -p tapir-tensor --bench tensor_ops)" >&2
    cargo bench -p tapir-tensor --bench tensor_ops >&2
fi

echo "== torch (benches/torch/tensor_ops.py)" >&2
python3 benches/torch/tensor_ops.py --time "$TIME" | tee "$TORCH_OUT" >&2

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
    ratio = r["ns"] / t_ns
    print(
        f"{bench_id:32} {fmt(r['elements'], t_ns, unit):>16} "
        f"{fmt(r['elements'], r['ns'], unit):>16} {ratio:11.2f}x"
    )
threads = next(iter(torch.values()))["threads"] if torch else "?"
print(f"\n(torch {next(iter(torch.values()))['torch'] if torch else '?'}, {threads} threads; "
      f"tapir uses rayon's default pool, {os.cpu_count()} CPUs)")
PY
