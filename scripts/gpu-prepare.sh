#!/usr/bin/env bash
# Builds, here, every program scripts/gpu-check.sh runs on the lent GPU
# machine (which has no Rust toolchain and reaches no registry), strips
# them, and puts them with a manifest in ONE ignored folder, gpu-bundle/:
#
#   scripts/gpu-prepare.sh                 # release build into gpu-bundle/
#   GPU_PREPARE_PROFILE=debug scripts/gpu-prepare.sh   # the test profile (CI's rehearsal)
#   GPU_BUNDLE=/some/dir scripts/gpu-prepare.sh
#
# Then the device command carries that folder (the device tool's `carry`:
# ["gpu-bundle"]) and runs `scripts/gpu-check.sh`.
#
# What goes in gpu-bundle/:
#   bin/tapir                    the CLI (bench, memcheck, gpt, pinn)
#   bin/differential             crates/cuda-emu/examples/differential.rs
#   bin/nn_step                  the training-step bench (crates/nn/benches)
#   bin/libtapir_bench_ffi.so    benches/ffi, for benches/torch/cuda_ops.py
#   bin/libtapir_cuda_emu.so, bin/libtapir_cuda_emu_cublas.so
#                                the emulated device (the differential's other side)
#   bin/test-<crate>-<name>      every test binary holding a test whose name
#                                has "cuda" or "nvrtc" in it (CI's selection)
#   MANIFEST                     what each file is, its size and sha256, the
#                                commit, the toolchain, and the tests of each
#                                test binary that the check runs
# Fails when the folder and the working tree that travels with it (tracked
# and untracked-not-ignored files) are together over 60 MiB (the device
# tool takes 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

PROFILE="${GPU_PREPARE_PROFILE:-release}"
BUNDLE="${GPU_BUNDLE:-gpu-bundle}"
LIMIT_MIB="${GPU_PREPARE_LIMIT_MIB:-60}"
case "$PROFILE" in
    release) PFLAG=(--release) DIR=release ;;
    debug) PFLAG=() DIR=debug ;;
    *) echo "GPU_PREPARE_PROFILE is release or debug, not $PROFILE" >&2 && exit 2 ;;
esac
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
START=$(date +%s)

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin"
BUNDLE="$(cd "$BUNDLE" && pwd)"
MSGS="$(mktemp)"
trap 'rm -f "$MSGS"' EXIT

# cargo's JSON messages name every executable it wrote. Whole-workspace
# builds only: cargo unifies features over the packages
# named, so naming the workspace reuses CI's own build in the test profile.
echo "== cargo build ($PROFILE): tapir, the emulator, the bench FFI library, the differential example"
cargo build "${PFLAG[@]}" --workspace
cargo build "${PFLAG[@]}" --workspace --example differential
echo "== cargo test --no-run ($PROFILE): the test binaries and the training-step bench"
cargo test "${PFLAG[@]}" --workspace --lib --tests --no-run --message-format=json >"$MSGS"
cargo test "${PFLAG[@]}" --workspace --bench nn_step --no-run --message-format=json >>"$MSGS"

put() { # put SRC NAME: copy and strip
    cp "$1" "$BUNDLE/bin/$2"
    chmod u+w "$BUNDLE/bin/$2"
    strip --strip-unneeded "$BUNDLE/bin/$2" 2>/dev/null || strip "$BUNDLE/bin/$2"
}
put "$TARGET/$DIR/tapir" tapir
put "$TARGET/$DIR/examples/differential" differential
put "$TARGET/$DIR/libtapir_bench_ffi.so" libtapir_bench_ffi.so
put "$TARGET/$DIR/libtapir_cuda_emu.so" libtapir_cuda_emu.so
put "$TARGET/$DIR/libtapir_cuda_emu_cublas.so" libtapir_cuda_emu_cublas.so

# Test binaries (and the bench) from cargo's messages: "test-<package>-<target>".
python3 - "$MSGS" "$PWD" >"$BUNDLE/.executables" <<'PY'
import json, os, sys
root = sys.argv[2]
seen = set()
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    # The package's folder names it: crates/tensor -> tensor, the root -> tapir.
    rel = os.path.relpath(os.path.dirname(m["manifest_path"]), root)
    pkg = "tapir" if rel == "." else os.path.basename(rel)
    # The emulator's own tests check the interpreter: no use on a GPU.
    if rel.startswith("crates/cuda-emu"):
        continue
    kind = "bench" if "bench" in t["kind"] else "test"
    name = "nn_step" if kind == "bench" else f"test-{pkg}-{t['name']}".replace("_", "-")
    if name not in seen:
        seen.add(name)
        print(kind, name, m["executable"])
PY
{
    echo "# gpu-bundle: programs for scripts/gpu-check.sh, built by scripts/gpu-prepare.sh"
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!gpu-bundle' || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) profile $PROFILE"
    echo "rustc $(rustc --version)"
    echo "cudarc $(grep -o 'cuda-1[0-9]*' crates/tensor/Cargo.toml | head -n 1) (CUDA 13 and 12 libraries, chosen at run time)"
} >"$BUNDLE/MANIFEST"
TESTS=0
while read -r kind name exe; do
    if [[ $kind == bench ]]; then
        put "$exe" "$name"
        continue
    fi
    # The tests the check runs: those CI runs on the emulated device.
    list="$("$exe" --list --format terse 2>/dev/null | sed -n 's/: test$//p' | grep -E 'cuda|nvrtc' || true)"
    [[ -z $list ]] && continue
    put "$exe" "$name"
    TESTS=$((TESTS + 1))
    echo "tests $name $(echo "$list" | wc -l): $(echo "$list" | tr '\n' ' ')" >>"$BUNDLE/MANIFEST.tests"
done <"$BUNDLE/.executables"
rm -f "$BUNDLE/.executables"
echo "files (name bytes sha256):" >>"$BUNDLE/MANIFEST"
(cd "$BUNDLE/bin" && for f in *; do echo "  $f $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"; done) >>"$BUNDLE/MANIFEST"
cat "$BUNDLE/MANIFEST.tests" >>"$BUNDLE/MANIFEST"
rm -f "$BUNDLE/MANIFEST.tests"

# The size that travels: this folder, and the working tree the device tool
# sends (tracked files, and untracked files git does not ignore).
bundle_b=$(du -sb "$BUNDLE" | cut -f1)
tree_b=$( (git ls-files -z --cached; git ls-files -z --others --exclude-standard) | sort -zu |
    xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total_b=$((bundle_b + tree_b))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "sizes: bundle $(mib "$bundle_b") + working tree $(mib "$tree_b") = $(mib "$total_b") (limit ${LIMIT_MIB} MiB)" |
    tee -a "$BUNDLE/MANIFEST"
echo "== $BUNDLE: $TESTS test binaries, $(ls "$BUNDLE/bin" | wc -l) files, $(($(date +%s) - START)) s"
if ((total_b > LIMIT_MIB * 1048576)); then
    echo "the bundle and the working tree exceed ${LIMIT_MIB} MiB" >&2
    exit 1
fi
