#!/usr/bin/env bash
# Runs cudarc 0.19's own unit tests (driver, NVRTC, cuBLAS, NCCL) and examples,
# from its crate source in cargo's registry, against tapir's emulated CUDA
# device, and prints the pass counts. Tests and examples that need what the
# emulator does not provide are skipped, each with its reason below; any
# other failure fails the script.
#
#   scripts/cudarc-suite.sh            # builds the emulator, then runs
#   TAPIR_CUDA_EMU_LIB=dir scripts/cudarc-suite.sh   # another build's libraries
#
# Needs NVRTC (TAPIR_NVRTC_LIB, or nvidia-cuda-nvrtc-cu12 from PyPI) and
# cudarc 0.19.10's source in ~/.cargo/registry (any build of tapir fetches it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# name|reason: unit tests (substring of the test path) the emulator cannot run.
EXCLUDED_TESTS=(
    "driver::safe::graph::|CUDA graphs and stream capture are not emulated"
    "driver::safe::core::tests::test_event_try_is_complete_preserves_capture_error|stream capture is not emulated"
    "driver::safe::unified_memory::|managed (unified) memory is not emulated"
    "driver::safe::core::tests::test_pinned_copy_is_faster|hardware timing: asserts pinned copies beat pageable ones"
    "driver::safe::core::tests::test_default_pinned_host_reads_are_faster_than_write_combined|hardware timing: compares host read speeds of two pinned kinds"
    "driver::safe::launch::tests::test_par_launch|hardware timing: asserts two streams halve the time of one, by event timings"
)
# Tests cudarc marks #[ignore] ("must be executed by itself" or "with
# multiple gpus"), each run alone here (the emulator has two devices).
ALONE_TESTS=(
    driver::result::tests::peer_transfer_contexts
    driver::result::tests::re_associate_context_for_memory_op
    driver::safe::core::tests::test_post_alloc_memory
    driver::safe::launch::tests::test_device_side_assert
    driver::safe::launch::tests::test_peer_memcpy_waits_for_src_stream
)
# name|reason: ignored tests not run alone.
EXCLUDED_ALONE=()
# name|reason: examples the emulator cannot run.
EXCLUDED_EXAMPLES=(
    "08-cupti|CUPTI (the profiling library) is not emulated and needs its own feature"
    "cufile-copy|cuFile (GPUDirect Storage) is not emulated and needs its own feature"
    "13-copy-multi-gpu|a stream-order race in cudarc 0.19.10 itself, which the emulator's hazard check reports: CudaStream::memcpy_dtod across devices waits on a temporary event whose drop binds the source context again, so the peer copy on the null stream runs on the source device's legacy stream, and the destination stream's read and free of the copy are not ordered after it (core.rs, memcpy_dtod's peer branch)"
)

src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.10 2>/dev/null | head -1 || true)
if [ -z "$src" ]; then
    echo "cudarc 0.19.10's source is not in cargo's registry (run any cargo build of tapir first)" >&2
    exit 1
fi
if [ -z "${TAPIR_NVRTC_LIB:-}" ]; then
    TAPIR_NVRTC_LIB=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib", "libnvrtc.so.12"))')
fi
if [ -z "${TAPIR_CUDA_EMU_LIB:-}" ]; then
    cargo build -q -p tapir-cuda-emu -p tapir-cuda-emu-cublas -p tapir-cuda-emu-nccl
    TAPIR_CUDA_EMU_LIB=$root/target/debug
fi
emu_dir=$(cd "${TAPIR_CUDA_EMU_LIB%/libtapir_cuda_emu.so}" && pwd)

work=$root/target/cudarc-suite
rm -rf "$work/cudarc" "$work/lib"
mkdir -p "$work/lib"
cp -r "$src" "$work/cudarc"
chmod -R u+w "$work/cudarc"
# A package of its own (not a member of tapir's workspace), resolved
# offline: the optional dependencies nothing here enables, and that the
# registry may not hold, go, and so does the pinned lock file.
python3 - "$work/cudarc/Cargo.toml" <<'PY'
import re, sys
path = sys.argv[1]
out, skip = [], False
for line in open(path).read().split("\n"):
    if line.startswith("["):
        skip = line.strip() in ("[dependencies.float4]", "[dependencies.float8]", "[dependencies.no-std-compat]")
    if not skip:
        out.append(line)
s = "\n".join(out)
s = s.replace('no-std = ["no-std-compat/std"]', "no-std = []")
s = s.replace('f4 = ["dep:float4"]', "f4 = []").replace('f8 = ["dep:float8"]', "f8 = []")
open(path, "w").write(s + "\n[workspace]\n")
PY
rm -f "$work/cudarc/Cargo.lock"

# The names cudarc opens (and NVRTC, libcuda.so.1), all the emulator.
ln -s "$emu_dir/libtapir_cuda_emu.so" "$work/lib/libcuda.so"
ln -s "$emu_dir/libtapir_cuda_emu.so" "$work/lib/libcuda.so.1"
ln -s "$emu_dir/libtapir_cuda_emu_cublas.so" "$work/lib/libcublas.so"
ln -s "$emu_dir/libtapir_cuda_emu_nccl.so" "$work/lib/libnccl.so"
export LD_LIBRARY_PATH="$work/lib:$(dirname "$TAPIR_NVRTC_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TAPIR_CUDA_EMU_DEVICES=${TAPIR_CUDA_EMU_DEVICES:-2}
export TAPIR_CUDA_EMU_MEMORY=${TAPIR_CUDA_EMU_MEMORY:-2G}
export CARGO_TARGET_DIR=$work/build
# No debug info and no incremental state: a third of the disk and link time.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_INCREMENTAL=0

features=std,driver,nvrtc,cublas,nccl,dynamic-loading,cuda-12090
cd "$work/cudarc"
echo "== building cudarc 0.19.10's tests and examples ($features)"
cargo test --offline -q --no-default-features --features "$features" --lib --no-run
cargo build --offline -q --no-default-features --features "$features" --examples 2>/dev/null || true

skips=()
for e in "${EXCLUDED_TESTS[@]}"; do
    skips+=(--skip "${e%%|*}")
    echo "excluded test ${e%%|*}: ${e#*|}"
done
echo "== unit tests"
set +e
cargo test --offline --no-default-features --features "$features" --lib -- --test-threads=1 "${skips[@]}" >"$work/tests.log" 2>&1
grep -E "^test |^test result" "$work/tests.log"
set -e
summary=$(grep "^test result" "$work/tests.log" | tail -1 || true)
if [ -z "$summary" ]; then
    # The test process died (a crash inside a library, say): count what ran.
    summary="the test process died after $(grep -c '\.\.\. ok$' "$work/tests.log" || true) passed: $(grep -A3 '^Caused by' "$work/tests.log" | tail -1)"
    failed_tests="(process died)"
fi
failed_tests="${failed_tests:-}$(grep -E "^test .* \.\.\. FAILED" "$work/tests.log" | sed 's/^test \(.*\) \.\.\. FAILED/\1/' || true)"

echo "== cudarc's ignored tests, each alone"
alone_pass=0
for t in "${ALONE_TESTS[@]}"; do
    if cargo test --offline -q --no-default-features --features "$features" --lib -- --ignored --exact "$t" \
        >"$work/alone.log" 2>&1; then
        alone_pass=$((alone_pass + 1))
        echo "test $t (alone): ok"
    else
        failed_tests="$failed_tests $t"
        echo "test $t (alone): FAILED"
        tail -5 "$work/alone.log" | sed 's/^/    /'
    fi
done
for e in "${EXCLUDED_ALONE[@]}"; do
    echo "excluded test ${e%%|*}: ${e#*|}"
done

echo "== examples"
ex_pass=0 ex_total=0 failed_examples=()
for f in examples/*.rs; do
    name=$(basename "$f" .rs)
    reason=""
    for e in "${EXCLUDED_EXAMPLES[@]}"; do
        [ "${e%%|*}" = "$name" ] && reason=${e#*|}
    done
    if [ -n "$reason" ]; then
        echo "excluded example $name: $reason"
        continue
    fi
    ex_total=$((ex_total + 1))
    if (cd "$work/cudarc" && timeout 300 cargo run --offline -q --no-default-features --features "$features" --example "$name" >"$work/example-$name.log" 2>&1); then
        ex_pass=$((ex_pass + 1))
        echo "example $name: ok"
    else
        failed_examples+=("$name")
        echo "example $name: FAILED (log: $work/example-$name.log)"
        tail -5 "$work/example-$name.log" | sed 's/^/    /'
    fi
done

echo "== cudarc 0.19.10 against the emulator"
echo "unit tests: $summary"
echo "ignored tests run alone: $alone_pass of ${#ALONE_TESTS[@]} passed"
echo "examples: $ex_pass of $ex_total passed"
if [ -n "$failed_tests" ] || [ ${#failed_examples[@]} -gt 0 ]; then
    echo "failed tests: $(echo $failed_tests)"
    echo "failed examples: ${failed_examples[*]:-}"
    exit 1
fi
