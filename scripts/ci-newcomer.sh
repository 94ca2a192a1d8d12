#!/usr/bin/env bash
# CI: what a newcomer does, checked. Fails on any failure.
#
# 1. Every crate packages, in dependency order (`cargo package --workspace`
#    with the workspace's own unpublished dependencies resolved from a local
#    registry; crates with `publish = false` left out), and tapir-tensor's
#    package holds the kernels. CI packages
#    without the verify build (`--no-verify`): building every crate again
#    from its .crate file takes minutes on 2 cores; run
#    `cargo package --workspace` by hand for the full check.
# 2. The docs build with rustdoc's warnings denied (broken links included).
# 3. The README's "CUDA without a GPU" section, run command by command in
#    this checkout (CI's own clean clone of the commit), in a clean
#    environment: every fenced `sh` block of that section, each line as
#    written. Running here rather than in a second clone reuses CI's builds
#    (a second clone's path would rebuild every tapir crate); set
#    TAPIR_NEWCOMER_CLONE=1 to follow it in a fresh clone instead.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR=never
target="${CARGO_TARGET_DIR:-$root/target}"
t0=$SECONDS

echo "== cargo package --workspace --no-verify (the published crates)"
# The crates marked `publish = false` (test support, the emulator, the bench
# library) are left out: they are never packaged, and the ones that depend
# on each other by path alone could not be.
mapfile -t unpublished < <(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") == []:
        print(p["name"])')
excludes=()
for name in "${unpublished[@]}"; do excludes+=(--exclude "$name"); done
cargo package --workspace "${excludes[@]}" --allow-dirty --no-verify --quiet
kernels="$(cargo package -p tapir-tensor --allow-dirty --list --quiet | grep -c '^kernels/.*\.cu' || true)"
if [ "$kernels" -lt 1 ]; then
    echo "tapir-tensor's package holds no kernels/*.cu" >&2
    exit 1
fi
echo "packaged in $((SECONDS - t0)) s (tapir-tensor carries $kernels kernel files)"

t1=$SECONDS
echo "== cargo doc, warnings denied"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "documented in $((SECONDS - t1)) s"

t2=$SECONDS
echo "== the README's \"CUDA without a GPU\" section"
# The section's commands, one per line: every line of its ```sh blocks.
commands="$(awk '
    /^## / { in_section = ($0 == "## CUDA without a GPU") }
    in_section && /^```sh$/ { in_block = 1; next }
    in_block && /^```$/ { in_block = 0; next }
    in_section && in_block && NF && $1 !~ /^#/ { print }
' README.md)"
if [ -z "$commands" ]; then
    echo "README.md has no sh commands under \"## CUDA without a GPU\"" >&2
    exit 1
fi
if [ "${TAPIR_NEWCOMER_CLONE:-0}" = 1 ]; then
    clone="$(mktemp -d)"
    trap 'rm -rf "$clone"' EXIT
    git clone --quiet "$root" "$clone/tapir"
    cd "$clone/tapir"
fi
# A newcomer's environment: nothing of CI's device selection carries over.
unset TAPIR_CUDA TAPIR_REQUIRE_CUDA TAPIR_CUDA_EMU_LIB TAPIR_CUDA_EMU_CUBLAS_LIB
export CARGO_TARGET_DIR="$target"
while IFS= read -r cmd; do
    echo "\$ $cmd"
    start=$SECONDS
    bash -euo pipefail -c "$cmd"
    echo "($((SECONDS - start)) s)"
done <<< "$commands"
echo "README section followed in $((SECONDS - t2)) s; newcomer checks in $((SECONDS - t0)) s"
