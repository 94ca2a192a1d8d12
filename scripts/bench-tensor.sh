#!/usr/bin/env bash
# Runs the tapir-tensor CPU benchmarks and their PyTorch mirror on the same
# shapes, then prints each one's throughput and the ratio tapir / torch
# (above 1 means tapir is faster).
#
#   scripts/bench-tensor.sh                  # every benchmark
#   scripts/bench-tensor.sh matmul_f32/1024  # some of them
#   TAPIR_BENCH_PAIRS=5 scripts/bench-tensor.sh sum_last_axis_f32/4096x4096
#                                            # 5 back-to-back pairs, median ratio
#   TAPIR_BENCH_INTERLEAVE=5 scripts/bench-tensor.sh
#                                            # both libraries in one process:
#                                            # 5 alternating pairs per benchmark
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

if [[ -n "${TAPIR_BENCH_INTERLEAVE:-}" ]]; then
    # One process: torch's script loads tapir's kernels (benches/ffi) and
    # alternates the two, so a machine whose speed drifts over minutes
    # (memory-bound kernels on the shared VM move between 10 and 20
    # Gelem/s) affects both sides of every pair alike.
    cargo build --release -p tapir-bench-ffi >&2
    LIB="${CARGO_TARGET_DIR:-target}/release/libtapir_bench_ffi.so"
    OUT="$(mktemp)"
    trap 'rm -f "$OUT"' EXIT
    for id in "${IDS[@]}"; do
        python3 benches/torch/tensor_ops.py --interleave "$LIB" --pairs "$TAPIR_BENCH_INTERLEAVE" \
            --time "${TAPIR_BENCH_TIME:-1}" --only "$id" | tee -a "$OUT" >&2
    done
    python3 - "$OUT" <<'PY'
import json, os, sys
print()
print(f"{'benchmark':32} {'tapir':>16} {'torch':>16} {'tapir/torch':>12}")
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    r = json.loads(line)
    unit = "GFLOP/s" if r["id"].startswith("matmul") else "Gelem/s"
    e = r["elements"]
    ratios = sorted(o / t for t, o in zip(r["tapir_ns"], r["torch_ns"]))
    t = sorted(r["tapir_ns"])[len(r["tapir_ns"]) // 2]
    o = sorted(r["torch_ns"])[len(r["torch_ns"]) // 2]
    print(f"{r['id']:32} {e / t:8.2f} {unit} {e / o:8.2f} {unit} {r['ratio']:11.2f}x"
          f"   ({len(ratios)} pairs: {ratios[0]:.2f}x to {ratios[-1]:.2f}x)")
print(f"\n(one process, alternating pairs; torch {r['torch']}, {r['threads']} threads; "
      f"{os.cpu_count()} CPUs, load average {open('/proc/loadavg').read().split()[0]})")
PY
    exit 0
fi
PAIRS="${TAPIR_BENCH_PAIRS:-1}"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
export TARGET_DIR
PAIRS_OUT="$(mktemp)"
trap 'rm -f "$PAIRS_OUT"' EXIT

# tapir's mean time per call (ns) from criterion's last run of one id.
tapir_ns() {
    python3 - "$1" <<'PY'
import json, os, sys
group, param = sys.argv[1].split("/", 1)
path = os.path.join(os.environ["TARGET_DIR"], "criterion", group, param, "new", "estimates.json")
print(json.load(open(path))["mean"]["point_estimate"] if os.path.exists(path) else "null")
PY
}

cargo bench -p tapir-tensor --bench tensor_ops --no-run >&2
for id in "${IDS[@]}"; do
    for pair in $(seq "$PAIRS"); do
        echo "== $id (pair $pair of $PAIRS)" >&2
        cargo bench -q -p tapir-tensor --bench tensor_ops -- "^${id}\$" >&2
        t_ns="$(tapir_ns "$id")"
        torch_line="$(python3 benches/torch/tensor_ops.py --time "$TIME" --only "$id")"
        echo "$torch_line" >&2
        python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["tapir_ns"]=json.loads(sys.argv[2]); print(json.dumps(r))' \
            "$torch_line" "$t_ns" >> "$PAIRS_OUT"
    done
done

python3 - "$PAIRS_OUT" <<'PY'
import json, os, statistics, sys

pairs = {}
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        pairs.setdefault(r["id"], []).append(r)

def fmt(work, ns, unit):
    return f"{work / ns:8.2f} {unit}"  # work per ns = G work per s

print()
print(f"{'benchmark':32} {'tapir':>16} {'torch':>16} {'tapir/torch':>12}")
for bench_id, rs in pairs.items():
    unit = "GFLOP/s" if bench_id.startswith("matmul") else "Gelem/s"
    done = [r for r in rs if r["tapir_ns"] is not None]
    if not done:
        print(f"{bench_id:32} {'(no result)':>16} {fmt(rs[0]['elements'], rs[0]['ns'], unit):>16}")
        continue
    # Throughput ratios of pairs run back to back; their median is reported.
    ratios = sorted(r["ns"] / r["tapir_ns"] for r in done)
    t_ns = statistics.median(r["tapir_ns"] for r in done)
    o_ns = statistics.median(r["ns"] for r in done)
    line = (f"{bench_id:32} {fmt(done[0]['elements'], t_ns, unit):>16} "
            f"{fmt(done[0]['elements'], o_ns, unit):>16} {statistics.median(ratios):11.2f}x")
    if len(ratios) > 1:
        line += f"   ({len(ratios)} pairs: {ratios[0]:.2f}x to {ratios[-1]:.2f}x)"
    print(line)
if pairs:
    r = next(iter(pairs.values()))[0]
    print(f"\n(torch {r['torch']}, {r['threads']} threads; tapir on its helper pool (RAYON_NUM_THREADS sets its size); "
          f"{os.cpu_count()} CPUs, load average {open('/proc/loadavg').read().split()[0]})")
PY
