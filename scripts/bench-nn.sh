#!/usr/bin/env bash
# Runs the training-step benchmarks of tapir-nn (crates/nn/benches/nn_step.rs)
# and their PyTorch mirrors (benches/torch/mlp_step.py, gpt_step.py), then
# prints time per step and peak memory per step side by side, with the
# ratios torch / tapir for time (above 1: tapir is faster) and tapir / torch
# for peak memory (below 1: tapir needs less).
#
#   scripts/bench-nn.sh                               # both, then the table
#   TAPIR_BENCH_SKIP_RUST=1 scripts/bench-nn.sh       # reuse the last criterion run
#
# Needs python3 with torch. Criterion's mean is read from
# target/criterion/nn_step/<id>/new/estimates.json; tapir's peak bytes are
# the exact allocator counts the bench prints before timing; torch's are
# from its profiler (see benches/torch/nn_common.py: a lower bound).
set -euo pipefail
cd "$(dirname "$0")/.."

TIME="${TAPIR_BENCH_TIME:-4}"
RUST_OUT="$(mktemp)"
TORCH_OUT="$(mktemp)"
trap 'rm -f "$RUST_OUT" "$TORCH_OUT"' EXIT

if [[ -z "${TAPIR_BENCH_SKIP_RUST:-}" ]]; then
    echo "== tapir (cargo bench -p tapir-nn --bench nn_step)" >&2
    cargo bench -p tapir-nn --bench nn_step | tee "$RUST_OUT" >&2
fi

echo "== torch (benches/torch/mlp_step.py, gpt_step.py)" >&2
for s in mlp_step gpt_step; do
    python3 "benches/torch/$s.py" --time "$TIME" 2>/dev/null | grep '^{' | tee -a "$TORCH_OUT" >&2
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
    group, param = bench_id.split("/", 1)
    path = os.path.join(target, "criterion", group, param, "new", "estimates.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))["mean"]["point_estimate"]

mib = lambda b: f"{b / 2**20:7.2f} MiB"
print()
print(f"{'step':14} {'tapir':>10} {'torch':>10} {'torch/tapir':>12}   "
      f"{'tapir peak':>12} {'torch peak':>12} {'tapir/torch':>12}")
for bench_id, r in torch.items():
    t_ns = tapir_ns(bench_id)
    t = f"{t_ns / 1e6:7.2f} ms" if t_ns else "  (none)"
    speed = f"{r['ns'] / t_ns:11.2f}x" if t_ns else ""
    m = tapir_mem.get(bench_id)
    peak = mib(m["peak_bytes"]) if m else "(rerun)"
    ratio = f"{m['peak_bytes'] / r['peak_bytes']:11.2f}x" if m else ""
    print(f"{bench_id:14} {t:>10} {r['ns'] / 1e6:7.2f} ms {speed:>12}   "
          f"{peak:>12} {mib(r['peak_bytes']):>12} {ratio:>12}")
if torch:
    r = next(iter(torch.values()))
    print(f"\n(torch {r['torch']}, {r['threads']} threads, eager; "
          f"tapir uses rayon's default pool, {os.cpu_count()} CPUs; time = mean per step)")
PY
