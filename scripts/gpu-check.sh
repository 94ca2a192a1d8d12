#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (the CUDA backend), in one run of at most
# 8 minutes, for a machine with a GPU, its driver, cargo, and python3 with
# torch (for the PyTorch mirrors):
#
#   scripts/gpu-check.sh                 # logs and summary.json in ./gpu-out
#   OUT=/some/dir scripts/gpu-check.sh
#
# Steps, each under `timeout` and within one overall deadline:
#   1. the machine: nvidia-smi, the driver, torch's view of the GPU;
#   2. NVRTC: $TAPIR_NVRTC_LIB, else the nvidia-cuda-nvrtc-cu12 wheel that
#      torch's CUDA 12 builds depend on, else a pip install of it;
#   3. cargo build --release (the workspace and its tests);
#   4. cargo test --release --workspace with TAPIR_REQUIRE_CUDA=1 and
#      TAPIR_REQUIRE_NVRTC=1 (a skipped CUDA or NVRTC test is a failure);
#   5. the differential check: the same kernels, inputs and launches on the
#      emulated device (TAPIR_CUDA=emulated) and on the GPU, compared bit for
#      bit except kernels using .approx instructions, which must agree
#      within those instructions' documented error (the example
#      crates/cuda-emu/examples/differential.rs);
#   6. tapir bench and tapir memcheck, each beside its PyTorch mirror.
# Every step writes $OUT/<step>.log; $OUT/summary.json gathers the exit
# codes, times, and the JSON figures of bench and memcheck. The exit status
# is non-zero when any step failed or timed out.
#
#   7. the CUDA benchmarks beside PyTorch in one process
#      (benches/torch/cuda_ops.py over benches/ffi): matmul 4096 f32/bf16,
#      elementwise and reduction bandwidth against torch's copy, driver
#      allocations per timed loop.
#
# Never run on a GPU yet (no session has been lent one): the figures it
# prints are what docs/gpu-results.md is to record, with the date and the
# commit. `tapir bench --device cuda` (step 6) adds the cases at a GPU's
# scale: sparse cross-entropy at N=32,768 V=32,000 and N=8,192 V=128,256,
# the fused head at N=8,192 D=4,096 V=128,256 in bf16, each with its peak
# beside torch.cuda.max_memory_allocated.
#   8. the training steps (the MLP and the `tapir gpt` model) on CUDA beside
#      PyTorch eager, time and peak (scripts/bench-nn.sh with
#      TAPIR_BENCH_DEVICE=cuda).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET_S="${GPU_CHECK_BUDGET_S:-440}" # under 8 minutes with the kill grace and the summary
START=$(date +%s)
export CARGO_TERM_COLOR=never

STEPS=()
failed=0

# Seconds left before the deadline, at most $1.
left() {
    local rem=$((BUDGET_S - ($(date +%s) - START)))
    ((rem < 0)) && rem=0
    ((rem > $1)) && rem=$1
    echo "$rem"
}

# step NAME MAX_SECONDS COMMAND...: runs COMMAND under timeout, logs it to
# $OUT/NAME.log, and records "name rc seconds".
step() {
    local name=$1 max=$2
    shift 2
    local t0 rc limit
    t0=$(date +%s)
    limit=$(left "$max")
    if ((limit < 5)); then
        echo "== $name: skipped, the 8-minute budget is spent" | tee "$OUT/$name.log"
        STEPS+=("$name 124 0")
        failed=1
        return 124
    fi
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    STEPS+=("$name $rc $(($(date +%s) - t0))")
    if ((rc != 0)); then
        failed=1
        ((rc == 124 || rc == 137)) && echo "   timed out; see $OUT/$name.log" || echo "   failed ($rc); see $OUT/$name.log"
        tail -n 20 "$OUT/$name.log" | sed 's/^/   | /'
    fi
    return $rc
}

# 1. The machine.
step machine 30 bash -c 'nvidia-smi || exit 1; echo; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
    python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"'
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"

# 2. NVRTC.
find_nvrtc() {
    python3 -c 'import nvidia.cuda_nvrtc as m, os; p = os.path.join(list(m.__path__)[0], "lib", "libnvrtc.so.12"); assert os.path.isfile(p); print(p)' 2>/dev/null
}
if [[ -z "${TAPIR_NVRTC_LIB:-}" ]]; then
    TAPIR_NVRTC_LIB="$(find_nvrtc)" ||
        { step nvrtc_install 90 python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc-cu12 &&
            TAPIR_NVRTC_LIB="$(find_nvrtc)"; } || TAPIR_NVRTC_LIB=""
fi
export TAPIR_NVRTC_LIB TAPIR_REQUIRE_NVRTC=1 TAPIR_REQUIRE_CUDA=1
echo "TAPIR_NVRTC_LIB=${TAPIR_NVRTC_LIB:-<not found; the NVRTC test will fail>}"

# 3. Build (release, so the tests and benches below share one build).
step build 240 bash -c 'cargo build --release --workspace && cargo test --release --workspace --no-run'

# 4. The whole suite, CUDA and NVRTC required.
step test 180 cargo test --release --workspace

# 5. The emulator against the GPU: each side writes its outputs, then the
# two are compared (a non-zero exit lists the kernels that differ).
DIFF=(cargo run --release -q -p tapir-cuda-emu --example differential --)
step differential_emu 60 env TAPIR_CUDA=emulated "${DIFF[@]}" run "$OUT/differential-emu.txt"
step differential_gpu 30 env -u TAPIR_CUDA "${DIFF[@]}" run "$OUT/differential-gpu.txt"
step differential 20 "${DIFF[@]}" compare "$OUT/differential-emu.txt" "$OUT/differential-gpu.txt"

# 6. Benches and memcheck, PyTorch mirrors included.
step bench 120 cargo run --release -q -p tapir-cli -- bench --json "$OUT/bench.json"
step memcheck 90 cargo run --release -q -p tapir-cli -- memcheck --json "$OUT/memcheck.json" --plot "$OUT/memcheck.png"
step bench_cuda 120 cargo run --release -q -p tapir-cli -- bench --device cuda --json "$OUT/bench-cuda.json"
step memcheck_cuda 90 cargo run --release -q -p tapir-cli -- memcheck --device cuda --json "$OUT/memcheck-cuda.json"

# 7. The CUDA kernels beside PyTorch's on this GPU (matmul 4096 f32/bf16,
# elementwise and reduction bandwidth against torch's copy, driver
# allocations per step), both in one process.
step cuda_bench 150 bash -c "set -o pipefail; cargo build --release -q -p tapir-bench-ffi &&
    python3 benches/torch/cuda_ops.py \"\${CARGO_TARGET_DIR:-target}/release/libtapir_bench_ffi.so\" --pairs 3 --time 1 |
    tee \"$OUT/cuda-bench.jsonl\""

# 8. The training steps on CUDA beside PyTorch eager (last: the budget may
# be spent by now, and every figure before it matters more).
step nn_steps 150 env TAPIR_BENCH_DEVICE=cuda TAPIR_BENCH_TIME=2 scripts/bench-nn.sh

# Summary.
{
    printf '{\n  "date": "%s",\n  "commit": "%s",\n  "gpu": "%s",\n  "nvrtc": "%s",\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git rev-parse HEAD 2>/dev/null)" "${GPU:-none}" "${TAPIR_NVRTC_LIB:-}"
    printf '  "seconds": %d,\n  "steps": {' $(($(date +%s) - START))
    sep=""
    for s in "${STEPS[@]}"; do
        read -r name rc secs <<<"$s"
        printf '%s\n    "%s": {"rc": %d, "seconds": %d, "log": "%s.log"}' "$sep" "$name" "$rc" "$secs" "$name"
        sep=","
    done
    printf '\n  },\n'
    for f in bench memcheck; do
        if [[ -s "$OUT/$f.json" ]] && python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$OUT/$f.json" 2>/dev/null; then
            printf '  "%s": ' "$f"
            cat "$OUT/$f.json"
            printf ',\n'
        else
            printf '  "%s": null,\n' "$f"
        fi
    done
    printf '  "owed": ["cross-entropy benchmarks at N=32768 V=32000, N=8192 V=128256 and the fused head at D=4096 (bf16)", "docs/gpu-results.md from this run"],\n'
    printf '  "steps_ok": %s\n}\n' "$([[ $failed == 0 ]] && echo true || echo false)"
} >"$OUT/summary.json"

echo "== summary: $OUT/summary.json ($(($(date +%s) - START)) s)"
head -n 20 "$OUT/summary.json"
exit $failed
