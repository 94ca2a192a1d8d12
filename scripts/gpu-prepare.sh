#!/usr/bin/env bash
# Builds, here, every program scripts/gpu-check.sh runs on the lent GPU
# machine (which has no Rust toolchain and reaches no registry), strips
# them, and puts them with a manifest in ONE ignored folder, gpu-bundle/:
#
#   scripts/gpu-prepare.sh                 # release build into gpu-bundle/
#   GPU_PREPARE_PROFILE=debug scripts/gpu-prepare.sh   # the test profile (CI's rehearsal)
#   GPU_BUNDLE=/some/dir scripts/gpu-prepare.sh
#   GPU_PREPARE_XZ_LEVEL=0 ...             # faster, larger packing (the rehearsal)
#   GPU_PREPARE_LIMIT_MIB=N ...            # another size limit (default 60)
#
# Then the device command carries that folder (the device tool's `carry`:
# ["gpu-bundle"]) and runs `scripts/gpu-check.sh`.
#
# What goes in gpu-bundle/ (bin/ packed as bin.tar.xz, which the check
# unpacks on the device):
#   bin/tapir                    the CLI (bench, memcheck, gpt, pinn)
#   bin/differential             crates/cuda-emu/examples/differential.rs
#   bin/nn_step                  the training-step bench (crates/nn/benches)
#   bin/libtapir_bench_ffi.so    benches/ffi, for benches/torch/cuda_ops.py
#   bin/libtapir_cuda_emu.so, bin/libtapir_cuda_emu_cublas.so,
#   bin/libtapir_cuda_emu_nccl.so
#                                the emulated device (the differential's other
#                                side; the rehearsal's data-parallel step)
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
    release) PFLAG=(--release) ;;
    debug) PFLAG=() ;;
    *) echo "GPU_PREPARE_PROFILE is release or debug, not $PROFILE" >&2 && exit 2 ;;
esac
START=$(date +%s)
# A CUDA test is compiled #[ignore]d unless a device was asked for when it
# was built (crates/testing/macros): the bundle is for a GPU, so ask.
export TAPIR_REQUIRE_CUDA=1

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin"
BUNDLE="$(cd "$BUNDLE" && pwd)"
MSGS="$(mktemp)"
trap 'rm -f "$MSGS"' EXIT

# `cargo test` builds every program the check runs (the workspace's
# libraries, binaries, tests and examples, and the training-step bench),
# and its JSON messages name each file it wrote. The whole workspace,
# named in both invocations, unifies features as CI's own
# `cargo test --workspace` does, so in the test profile nothing is
# compiled again (a `cargo build` beside it would resolve features without
# the dev-dependencies and rebuild every crate).
echo "== cargo test --no-run ($PROFILE): tapir, the emulator, the bench FFI library, the differential example, the tests, the training-step bench"
# (The default targets build examples as programs; `--examples` would make
# them test harnesses.)
cargo test "${PFLAG[@]}" --workspace --no-run --message-format=json >"$MSGS"
cargo test "${PFLAG[@]}" --workspace --bench nn_step --no-run --message-format=json >>"$MSGS"

put() { # put SRC NAME: copy and strip
    cp "$1" "$BUNDLE/bin/$2"
    chmod u+w "$BUNDLE/bin/$2"
    strip --strip-unneeded "$BUNDLE/bin/$2" 2>/dev/null || strip "$BUNDLE/bin/$2"
}
# The programs and libraries by name, from the same messages.
python3 - "$MSGS" >"$BUNDLE/.programs" <<'PY'
import json, sys
want = {("bin", "tapir"): "tapir", ("example", "differential"): "differential"}
libs = ["libtapir_bench_ffi.so", "libtapir_cuda_emu.so", "libtapir_cuda_emu_cublas.so", "libtapir_cuda_emu_nccl.so"]
found = {}
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact":
        continue
    t = m["target"]
    # A binary or example built as a test harness has the same name.
    if m["profile"]["test"]:
        continue
    for kind in t["kind"]:
        if (kind, t["name"]) in want and m.get("executable"):
            found[want[(kind, t["name"])]] = m["executable"]
    for f in m.get("filenames", []):
        if f.rsplit("/", 1)[-1] in libs:
            found[f.rsplit("/", 1)[-1]] = f
missing = [n for n in list(want.values()) + libs if n not in found]
if missing:
    sys.exit(f"cargo's messages name no {', '.join(missing)}")
for name, path in found.items():
    print(path, name)
PY
while read -r src name; do put "$src" "$name"; done <"$BUNDLE/.programs"
rm -f "$BUNDLE/.programs"

# Test binaries (and the bench) from cargo's messages: "test-<package>-<target>".
python3 - "$MSGS" "$PWD" >"$BUNDLE/.executables" <<'PY'
import json, os, sys
root = sys.argv[2]
seen = set()
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    # Test harnesses only (the programs above are built without one).
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
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

# bin/ packed into one xz archive (stripped binaries shrink to about a
# quarter): the check unpacks it on the device, in its own work folder.
tar -C "$BUNDLE" -cf - bin | xz -T0 "-${GPU_PREPARE_XZ_LEVEL:-6}" >"$BUNDLE/bin.tar.xz"
unpacked_b=$(du -sb "$BUNDLE/bin" | cut -f1)
files=$(ls "$BUNDLE/bin" | wc -l)
rm -rf "$BUNDLE/bin"

# The size that travels: this folder, and the working tree the device tool
# sends (tracked files, and untracked files git does not ignore).
bundle_b=$(du -sb "$BUNDLE" | cut -f1)
tree_b=$( (git ls-files -z --cached; git ls-files -z --others --exclude-standard) | sort -zu |
    xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total_b=$((bundle_b + tree_b))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "sizes: bundle $(mib "$bundle_b") (bin/ $(mib "$unpacked_b") unpacked) + working tree $(mib "$tree_b") = $(mib "$total_b") (limit ${LIMIT_MIB} MiB)" |
    tee -a "$BUNDLE/MANIFEST"
echo "== $BUNDLE: $TESTS test binaries, $files files packed in bin.tar.xz, $(($(date +%s) - START)) s"
if ((total_b > LIMIT_MIB * 1048576)); then
    echo "the bundle and the working tree exceed ${LIMIT_MIB} MiB" >&2
    exit 1
fi
