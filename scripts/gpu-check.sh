#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (tapir's CUDA backend), run on the lent
# GPU machine in one command of at most 8 minutes. That machine has the GPU,
# its driver, CUDA 13's libraries (the nvidia-* wheels of PyTorch's Python
# and the toolkit's lib64), PyTorch, compute-sanitizer and Nsight Compute,
# but no Rust toolchain and no registry to fetch from: this script runs only
# the programs scripts/gpu-prepare.sh built here, from gpu-bundle/ (see its
# MANIFEST), and never cargo or pip.
#
#   scripts/gpu-prepare.sh                       # here: build gpu-bundle/
#   device run, carry ["gpu-bundle"]:  scripts/gpu-check.sh   # there
#   OUT=/some/dir scripts/gpu-check.sh           # (default ./gpu-out)
#
# What comes back is at most 8 files, flat in $OUT: summary.json (each
# step's status, exit code and seconds, the machine, the libraries, the
# headline figures) and gpu-check.tar.gz holding every log and result file
# (split into gpu-check.tar.gz.part-* if over 15 MiB). docs/gpu-results.md
# is written from them, the day the check runs.
#
# Steps, each under its own timeout and all within one deadline
# (GPU_CHECK_BUDGET_S, 450 s, leaves the packing inside 8 minutes); each
# writes <step>.log into the archive:
#   machine         nvidia-smi, the driver's CUDA version, torch's view of
#                   the GPU, the CUDA libraries present (CUDA 13 and 12) and
#                   the bundle's manifest.
#   libraries       the library selection test (crates/tensor/tests/
#                   cuda_libraries.rs), printing which driver, NVRTC and
#                   cuBLAS tapir opened ("in use: ...").
#   suite           every bundled test binary, its tests named "cuda" or
#                   "nvrtc" (the set CI runs on the emulated device), with
#                   TAPIR_REQUIRE_CUDA=1 and TAPIR_REQUIRE_NVRTC=1 so a skip
#                   is a failure; tapir picks NVRTC and cuBLAS itself
#                   (crates/tensor/src/cuda/libs.rs), nothing is pointed at.
#   differential    the same kernels, inputs and launches on the emulated
#                   device and on the GPU (bin/differential), compared bit
#                   for bit except .approx instructions, within their error.
#   sanitizer_*     compute-sanitizer's memcheck, racecheck, synccheck and
#                   initcheck over the CUDA test binaries (kernel-heavy ones
#                   first, as many as each tool's time allows; the log says
#                   which ran): the hardware's checker beside the emulator's.
#   ncu             Nsight Compute over the differential's GPU run (every
#                   kernel, fixed inputs, the launches the emulator runs),
#                   --clock-control none: requests, sectors, bank conflicts,
#                   instructions, lanes, registers, time; ncu-kernels.csv is
#                   the calibration data for the emulator's profiler.
#   bench_cuda      `tapir bench --device cuda` beside its PyTorch mirror
#                   (benches/torch/bench.py), GPU-scale cross-entropy cases
#                   included; bench-cuda.json.
#   memcheck_cuda   `tapir memcheck --device cuda` beside
#                   benches/torch/memcheck.py; memcheck-cuda.json.
#   attention_cuda  `tapir memcheck --device cuda --scenario attention`:
#                   the fused causal attention's forward + backward at
#                   T = 1,024 to 8,192 beside PyTorch's eager attention and
#                   F.scaled_dot_product_attention (peak bytes, time);
#                   attention-cuda.json. In the rehearsal, tapir's side
#                   alone at a small T (the emulator is no GPU for time).
#   cuda_ops        benches/torch/cuda_ops.py over bin/libtapir_bench_ffi.so:
#                   matmul, elementwise and reduction against PyTorch in one
#                   process; cuda-ops.jsonl.
#   nn_steps        the training steps (MLP, the gpt model) on CUDA beside
#                   PyTorch eager (scripts/bench-nn.sh over bin/nn_step).
#   ddp_cuda        with two GPUs or more: `tapir gpt` on 1 and on every GPU
#                   (--devices, NCCL) beside PyTorch DDP (benches/torch/
#                   gpt_ddp.py), tokens per second and the speed-up; on a
#                   one-GPU machine, recorded as skipped.
# The exit status is non-zero when any step failed or timed out.
#
# Rehearsal (GPU_CHECK_REHEARSAL=1, scripts/gpu-rehearse.sh, in CI): the
# emulated device stands in for the GPU, and a step whose tool this
# machine lacks (nvidia-smi, compute-sanitizer, ncu, torch) is reported
# "absent" instead of failing; on the GPU machine a missing tool fails.
# GPU_CHECK_TEST_FILTER narrows the suite; GPU_CHECK_BENCH_ARGS,
# GPU_CHECK_MEMCHECK_ARGS and GPU_CHECK_ATTENTION_ARGS replace the three
# commands' sizes; GPU_CHECK_DDP_STEPS and GPU_CHECK_DDP_MODEL (gpt flags)
# those of ddp_cuda, and GPU_CHECK_REHEARSAL_DEVICES is the number of
# emulated devices it gets in a rehearsal. GPU_CHECK_LIMIT_SCALE (default
# 1; the rehearsal sets 3) multiplies each step's own limit, not the
# deadline: a rehearsal interprets on the CI machine's two cores what the
# device runs on a GPU, and a busy machine must not fail it by a step's
# limit alone (the per-step seconds in the summary are still what to
# read against the device's budget).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

BUNDLE="${GPU_BUNDLE:-$ROOT/gpu-bundle}"
BUNDLE="$(cd "$BUNDLE" 2>/dev/null && pwd)" || {
    echo "no gpu-bundle/: run scripts/gpu-prepare.sh here and carry gpu-bundle to the device" >&2
    exit 2
}
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
# The programs travel packed (bin.tar.xz): unpacked into the work folder,
# with xz when the machine has it, else Python's lzma.
BIN="$BUNDLE/bin"
if [[ -f $BUNDLE/bin.tar.xz ]]; then
    if command -v xz >/dev/null 2>&1; then
        tar -xJf "$BUNDLE/bin.tar.xz" -C "$WORK"
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE/bin.tar.xz" "$WORK"
    fi || { echo "cannot unpack $BUNDLE/bin.tar.xz" >&2; exit 2; }
    BIN="$WORK/bin"
fi
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
LIMIT_SCALE="${GPU_CHECK_LIMIT_SCALE:-1}"
[[ $LIMIT_SCALE =~ ^[1-9][0-9]*$ ]] || { echo "GPU_CHECK_LIMIT_SCALE must be a whole number >= 1, not '$LIMIT_SCALE'" >&2; exit 2; }
START=$(date +%s)
export TAPIR_REQUIRE_CUDA=1 TAPIR_REQUIRE_NVRTC=1 PYTHONUNBUFFERED=1
if [[ $REHEARSAL == 1 ]]; then
    export TAPIR_CUDA=emulated TAPIR_CUDA_EMU_LIB="$BIN"
fi

STEPS=()
failed=0

# Seconds left before the deadline, at most $1.
left() {
    local rem=$((BUDGET_S - ($(date +%s) - START)))
    ((rem < 0)) && rem=0
    ((rem > $1)) && rem=$1
    echo "$rem"
}

# Whether this machine has each tool named ("torch": python3 imports it and
# it sees a CUDA device).
have() {
    local t
    for t in "$@"; do
        if [[ $t == torch ]]; then
            # PyTorch with a CUDA device (the rehearsal's has none).
            python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1 || return 1
        else
            command -v "$t" >/dev/null 2>&1 || return 1
        fi
    done
}

record() { # record NAME STATUS RC SECONDS
    STEPS+=("$1 $2 $3 $4")
    [[ $2 == failed || $2 == timeout ]] && failed=1
    return 0
}

# step NAME MAX_SECONDS [need TOOL...] -- COMMAND...: runs COMMAND under
# timeout into $WORK/NAME.log and records "name status rc seconds".
step() {
    local name=$1 max=$2 t0 rc limit status
    shift 2
    local needs=()
    if [[ ${1:-} == need ]]; then
        shift
        while [[ $1 != -- ]]; do needs+=("$1") && shift; done
    fi
    [[ ${1:-} == -- ]] && shift
    t0=$(date +%s)
    if ((${#needs[@]})) && ! have "${needs[@]}"; then
        echo "== $name: this machine lacks one of: ${needs[*]}" | tee "$WORK/$name.log"
        if [[ $REHEARSAL == 1 ]]; then record "$name" absent 127 0; else record "$name" failed 127 0; fi
        return 127
    fi
    limit=$(left $((max * LIMIT_SCALE)))
    if ((limit < 5)); then
        echo "== $name: skipped, the deadline is spent" | tee "$WORK/$name.log"
        record "$name" timeout 124 0
        return 124
    fi
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=5 "$limit" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
    record "$name" "$status" "$rc" $(($(date +%s) - t0))
    if ((rc != 0)); then
        echo "   $status ($rc); the last lines of $name.log:"
        tail -n 15 "$WORK/$name.log" | sed 's/^/   | /'
    fi
    return $rc
}

# The CUDA libraries this machine keeps where tapir looks (the site-packages
# of each python3 on PATH, toolkits), listed for the record; tapir chooses.
cuda_libraries() {
    local d f
    for d in $(echo "$PATH" | tr ':' ' '); do
        [[ -e $d/python3 ]] || continue
        for f in "$d"/../lib/python3*/site-packages/nvidia/{cu13,cu12,cuda_nvrtc,cublas}/lib/lib{nvrtc,cublas}.so.1[23]; do
            [[ -e $f ]] && readlink -f "$f"
        done
    done
    for f in ${CUDA_HOME:-/usr/local/cuda}/lib64/lib{nvrtc,cublas}.so.1[23] /usr/local/cuda-1[23]*/lib64/lib{nvrtc,cublas}.so.1[23]; do
        [[ -e $f ]] && readlink -f "$f"
    done
    ldconfig -p 2>/dev/null | grep -E 'lib(cuda|nvrtc|cublas)\.so' || true
}

# 1. The machine and the bundle.
step machine 30 -- bash -c '
    nvidia-smi || echo "(no nvidia-smi)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
    python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))" || echo "(no torch)"
    for t in compute-sanitizer ncu nvcc; do echo "$t: $(command -v $t || echo absent)"; done
    echo "uname: $(uname -a)"; echo "cpus: $(nproc)"
    echo "== CUDA libraries present"; '"$(declare -f cuda_libraries)"'; cuda_libraries
    echo "== bundle"; cat "'"$BUNDLE"'/MANIFEST"'
GPU="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
[[ $REHEARSAL == 1 ]] && GPU="emulated (rehearsal)"

# 2. The suite: every bundled test binary's CUDA and NVRTC tests.
TESTS=("$BIN"/test-*)
FILTER=(${GPU_CHECK_TEST_FILTER:-cuda nvrtc})
suite() {
    local t rc=0
    for t in "${TESTS[@]}"; do
        echo "== $(basename "$t") ${FILTER[*]}"
        "$t" "${FILTER[@]}" || { echo "!! $(basename "$t") failed"; rc=1; }
    done
    return $rc
}
# The library selection test first, its output kept (--nocapture): the
# line "in use: driver=... nvrtc=... cublas=..." says what tapir opened.
for t in "${TESTS[@]}"; do
    [[ $t == */test-tensor-cuda-libraries ]] &&
        step libraries 60 -- "$t" cuda_libraries --nocapture --test-threads=1
done
step suite 150 -- bash -c "$(declare -p TESTS FILTER); $(declare -f suite); suite"
# The libraries tapir chose, from the selection test's output.
grep -ho 'in use: .*' "$WORK/libraries.log" "$WORK/suite.log" 2>/dev/null | head -n 1 >"$WORK/libraries-chosen.txt" || true

# 3. The emulator against the GPU (in a rehearsal: against itself).
step differential_emu 45 -- env TAPIR_CUDA=emulated TAPIR_CUDA_EMU_LIB="$BIN" "$BIN/differential" run "$WORK/differential-emu.txt"
if [[ $REHEARSAL == 1 ]]; then
    step differential_gpu 30 -- "$BIN/differential" run "$WORK/differential-gpu.txt"
else
    step differential_gpu 30 -- env -u TAPIR_CUDA "$BIN/differential" run "$WORK/differential-gpu.txt"
fi
step differential 15 -- "$BIN/differential" compare "$WORK/differential-emu.txt" "$WORK/differential-gpu.txt"

# 4. compute-sanitizer, one step per tool; the kernel-heavy binaries first.
ORDERED=()
for n in ops reduce index cross-entropy matmul memory; do
    for t in "$BIN"/test-tensor-cuda-"$n"; do [[ -e $t ]] && ORDERED+=("$t"); done
done
for t in "${TESTS[@]}"; do [[ " ${ORDERED[*]} " == *" $t "* ]] || ORDERED+=("$t"); done
sanitize() { # sanitize TOOL SECONDS: as many binaries as the time allows
    local tool=$1 until=$(($(date +%s) + $2)) t rem rc=0
    for t in "${ORDERED[@]}"; do
        rem=$((until - $(date +%s)))
        if ((rem < 5)); then
            echo "-- not reached: $(basename "$t")"
            continue
        fi
        echo "== $tool: $(basename "$t") (limit ${rem}s)"
        timeout --kill-after=5 "$rem" compute-sanitizer --tool "$tool" --error-exitcode 86 \
            --target-processes all "$t" "${FILTER[@]}" --test-threads=1 -q
        case $? in
            0) echo "-- clean: $(basename "$t")" ;;
            124 | 137) echo "-- timed out: $(basename "$t")" ;;
            86) echo "-- ERRORS: $(basename "$t")" && rc=1 ;;
            *) echo "-- failed: $(basename "$t")" && rc=1 ;;
        esac
    done
    return $rc
}
SAN="$(declare -p ORDERED FILTER); $(declare -f sanitize)"
step sanitizer_memcheck 45 need compute-sanitizer -- bash -c "$SAN; sanitize memcheck 40"
step sanitizer_racecheck 30 need compute-sanitizer -- bash -c "$SAN; sanitize racecheck 25"
step sanitizer_synccheck 20 need compute-sanitizer -- bash -c "$SAN; sanitize synccheck 15"
step sanitizer_initcheck 30 need compute-sanitizer -- bash -c "$SAN; sanitize initcheck 25"

# 5. Nsight Compute over every kernel of the differential's launches.
METRICS=launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_static
METRICS+=,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__thread_inst_executed.sum
METRICS+=,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
METRICS+=,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
METRICS+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
METRICS+=,dram__bytes_read.sum,dram__bytes_write.sum
step ncu 60 need ncu -- bash -c "set -e
    env -u TAPIR_CUDA ncu --clock-control none --target-processes all --metrics $METRICS \
        -f -o '$WORK/ncu-differential' '$BIN/differential' run '$WORK/differential-ncu.txt'
    ncu --import '$WORK/ncu-differential.ncu-rep' --csv --page raw >'$WORK/ncu-kernels.csv'
    echo \"\$(grep -c . '$WORK/ncu-kernels.csv') lines in ncu-kernels.csv\""

# 6. tapir bench and memcheck on CUDA, each beside its PyTorch mirror.
read -r -a BENCH_ARGS <<<"${GPU_CHECK_BENCH_ARGS:-}"
read -r -a MEMCHECK_ARGS <<<"${GPU_CHECK_MEMCHECK_ARGS:-}"
# (The rehearsal runs tapir's side alone, --no-torch: no torch there.)
TORCH=torch
[[ $REHEARSAL == 1 ]] && TORCH=python3
step bench_cuda 90 need "$TORCH" -- "$BIN/tapir" bench --device cuda "${BENCH_ARGS[@]}" \
    --json "$WORK/bench-cuda.json" --plot "$WORK/bench-cuda.png"
step memcheck_cuda 45 need "$TORCH" -- "$BIN/tapir" memcheck --device cuda "${MEMCHECK_ARGS[@]}" \
    --json "$WORK/memcheck-cuda.json" --plot "$WORK/memcheck-cuda.png"
# Attention at long context beside PyTorch's eager attention and SDPA. A
# bundle built before the scenario existed says so and the step is
# recorded as skipped, with why, rather than failed.
read -r -a ATTENTION_ARGS <<<"${GPU_CHECK_ATTENTION_ARGS:---t 1024,2048,4096,8192 --reps 5}"
if "$BIN/tapir" memcheck --help 2>/dev/null | grep -q -- '--scenario'; then
    step attention_cuda 60 need "$TORCH" -- "$BIN/tapir" memcheck --device cuda --scenario attention \
        "${ATTENTION_ARGS[@]}" --json "$WORK/attention-cuda.json"
else
    echo "== attention_cuda: skipped: this bundle's tapir has no memcheck --scenario" | tee "$WORK/attention_cuda.log"
    record attention_cuda skipped 0 0
fi

# 7. The CUDA kernels beside PyTorch's in one process (matmul 4096 f32 and
# bf16, elementwise and reduction bandwidth against torch's copy, driver
# allocations per step).
step cuda_ops 60 need torch -- bash -c "set -o pipefail; python3 benches/torch/cuda_ops.py '$BIN/libtapir_bench_ffi.so' \
    --pairs 3 --time 1 | tee '$WORK/cuda-ops.jsonl'"

# 8. The training steps on CUDA beside PyTorch eager (last: every figure
# before it matters more).
step nn_steps 60 need torch -- env TAPIR_BENCH_DEVICE=cuda TAPIR_BENCH_TIME=2 TAPIR_BENCH_NN_BIN="$BIN/nn_step" \
    CARGO_TARGET_DIR="$WORK/target" scripts/bench-nn.sh

# 9. Data parallelism over every GPU of the machine: `tapir gpt` on one GPU
# and on all of them (`--devices`, one thread and one NCCL communicator
# each), beside PyTorch DDP on the same model, batch per rank and steps
# (benches/torch/gpt_ddp.py, one process per GPU); tokens per second and
# the speed-up from 1 to N GPUs, in ddp-*.json. It needs two GPUs: on a
# machine with one it is recorded as skipped, saying so. NCCL comes from
# PyTorch's wheel, which ships only libnccl.so.2, a name cudarc does not
# look up (it asks for libnccl.so): the step puts a libnccl.so link to it
# on the loader's path (README, "Several GPUs in one process"). The
# rehearsal runs tapir's side on GPU_CHECK_REHEARSAL_DEVICES emulated
# devices and the NCCL stand-in.
if [[ $REHEARSAL == 1 ]]; then
    NGPU=${GPU_CHECK_REHEARSAL_DEVICES:-1}
else
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
DDP_STEPS=${GPU_CHECK_DDP_STEPS:-300}
read -r -a DDP_MODEL <<<"${GPU_CHECK_DDP_MODEL:-}"
if ((NGPU >= 2)); then
    DEVICES=$(seq -s, -f 'cuda:%g' 0 $((NGPU - 1)))
    NCCL_LINKS="$WORK/nccl-links"
    mkdir -p "$NCCL_LINKS"
    for f in $(python3 -c 'import site, glob; print(" ".join(p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/*/lib/libnccl.so.2")))' 2>/dev/null); do
        ln -sf "$f" "$NCCL_LINKS/libnccl.so" && echo "NCCL: $f, linked as libnccl.so" && break
    done
    TAPIR_GPT=(gpt --batch 64 --steps "$DDP_STEPS" --warmup 10 --eval-every 0 --no-chart "${DDP_MODEL[@]}")
    ddp() {
        set -e
        echo "== tapir gpt on cuda:0"
        "$BIN/tapir" "${TAPIR_GPT[@]}" --device cuda:0 --json "$WORK/ddp-tapir-1.json"
        echo "== tapir gpt on $DEVICES"
        "$BIN/tapir" "${TAPIR_GPT[@]}" --devices "$DEVICES" --json "$WORK/ddp-tapir-$NGPU.json"
        if have torch; then
            echo "== PyTorch DDP on 1 and $NGPU GPUs"
            python3 benches/torch/gpt_ddp.py --worlds "1,$NGPU" --batch 64 --steps "$DDP_STEPS" --json "$WORK/ddp-torch.json"
        else
            echo "== PyTorch DDP: no torch with a CUDA device here"
        fi
    }
    step ddp_cuda 90 -- env LD_LIBRARY_PATH="$NCCL_LINKS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TAPIR_CUDA_EMU_DEVICES="$NGPU" \
        bash -c "$(declare -p BIN WORK NGPU DEVICES DDP_STEPS TAPIR_GPT); $(declare -f have ddp); ddp"
else
    echo "== ddp_cuda: skipped: this machine has $NGPU GPU(s); data parallelism needs two" | tee "$WORK/ddp_cuda.log"
    record ddp_cuda skipped 0 0
fi

# Summary, then everything packed into at most 8 files, flat in $OUT.
python3 - "$WORK" "$OUT/summary.json" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git rev-parse HEAD 2>/dev/null || sed -n 's/^commit //p' "$BUNDLE/MANIFEST")" \
    "${GPU:-none}" "$REHEARSAL" "$(($(date +%s) - START))" "${STEPS[@]}" <<'PY' || failed=1
import json, os, sys
work, out, date, commit, gpu, rehearsal, seconds, *steps = sys.argv[1:]
def load(name):
    p = os.path.join(work, name)
    try:
        if name.endswith(".jsonl"):
            return [json.loads(l) for l in open(p) if l.startswith("{")]
        return json.load(open(p))
    except (OSError, ValueError):
        return None
chosen = {}
p = os.path.join(work, "libraries-chosen.txt")
for word in (open(p).read().split()[2:] if os.path.exists(p) else []):
    k, _, v = word.partition("=")
    chosen[k] = v
summary = {
    "date": date, "commit": commit, "gpu": gpu, "rehearsal": rehearsal == "1", "seconds": int(seconds),
    "libraries": chosen,
    "steps": {s.split()[0]: {"status": s.split()[1], "rc": int(s.split()[2]), "seconds": int(s.split()[3]),
                             "log": s.split()[0] + ".log"} for s in steps},
    "bench_cuda": load("bench-cuda.json"), "memcheck_cuda": load("memcheck-cuda.json"),
    "attention_cuda": load("attention-cuda.json"),
    "cuda_ops": load("cuda-ops.jsonl"),
    "ddp_cuda": {n[4:-5]: load(n) for n in sorted(os.listdir(work)) if n.startswith("ddp-") and n.endswith(".json")},
    "archive": "gpu-check.tar.gz (every log and result file)",
}
summary["steps_ok"] = all(v["status"] in ("ok", "absent", "skipped") for v in summary["steps"].values())
json.dump(summary, open(out, "w"), indent=1)
PY
cp "$OUT/summary.json" "$WORK/summary.json" 2>/dev/null
tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" --exclude=./bin .
if (($(stat -c %s "$OUT/gpu-check.tar.gz") > 15 * 1048576)); then
    # The device tool brings back files of at most 16 MiB, 8 in all.
    split -b 15M -a 1 "$OUT/gpu-check.tar.gz" "$OUT/gpu-check.tar.gz.part-" && rm "$OUT/gpu-check.tar.gz"
    if (($(ls "$OUT" | wc -l) > 8)); then
        echo "the archive needs more than 7 parts; dropping the ncu report to fit" >&2
        rm -f "$OUT"/gpu-check.tar.gz.part-*
        tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" --exclude=./bin --exclude='*.ncu-rep' .
        split -b 15M -a 1 "$OUT/gpu-check.tar.gz" "$OUT/gpu-check.tar.gz.part-" && rm "$OUT/gpu-check.tar.gz"
    fi
fi
rm -rf "$WORK"
echo "== $OUT: $(ls "$OUT" | tr '\n' ' ')($(($(date +%s) - START)) s)"
grep -E '"(status|gpu|seconds)"' "$OUT/summary.json" | head -n 30
exit $failed
