#!/usr/bin/env bash
# CI: what a newcomer does, checked. Fails on any failure.
#
# 1. Every crate packages, in dependency order: `cargo package --workspace`
#    builds each published crate from its .crate file (the kernels must be
#    inside tapir-tensor's package), with the workspace's own unpublished
#    dependencies resolved from a local registry.
# 2. The docs build with rustdoc's warnings denied (broken links included).
# 3. The README's "CUDA without a GPU" section, run command by command on
#    a clean clone of this commit, in a clean environment: every fenced `sh`
#    block of that section, each line as written.
#
# The clone builds into this checkout's target folder, so the dependencies
# compiled by CI's earlier steps are reused; tapir's own crates build again
# (their path differs). Time on the 2-core development machine: see the
# README ("CUDA without a GPU").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR=never
target="${CARGO_TARGET_DIR:-$root/target}"
t0=$SECONDS

echo "== cargo package --workspace (each crate built from its package)"
cargo package --workspace --allow-dirty --quiet
echo "packaged in $((SECONDS - t0)) s"

t1=$SECONDS
echo "== cargo doc, warnings denied"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "documented in $((SECONDS - t1)) s"

t2=$SECONDS
echo "== the README's \"CUDA without a GPU\" section, on a clean clone"
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
clone="$(mktemp -d)"
trap 'rm -rf "$clone"' EXIT
git clone --quiet "$root" "$clone/tapir"
cd "$clone/tapir"
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
