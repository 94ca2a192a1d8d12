#!/usr/bin/env bash
# Instruction-count guard: no slowdown of the CPU kernels lands unseen.
#
# Counts the instructions each case of benches/icount.rs executes, under
# valgrind (cachegrind, no cache simulation), one thread
# (RAYON_NUM_THREADS=1), less the count of the same case run with
# `--setup` (the process's start, making the inputs, the exit), so each
# figure is the case's work alone, and compares them with the baseline kept in
# benches/icount.baseline. A case more than TAPIR_ICOUNT_TOLERANCE percent
# (default 5) over its baseline fails the run. To accept a change on
# purpose, update the baseline in the same commit, saying why:
#
#   scripts/icount-guard.sh                      # check (CI runs this)
#   scripts/icount-guard.sh --update "reason"    # rewrite the counts and
#                                                # append the reason line
#
# Counts repeat from run to run where times do not (a shared machine), but
# they measure instructions, not time. What they cannot judge, and which
# stays with `tapir bench` and scripts/bench-tensor.sh:
#   - memory-bound cases: the sparse cross-entropy and sums at full size,
#     whose time is set by memory traffic (a second pass over the logits
#     costs few instructions here but 500 MB of traffic at 4,096 x 32,000);
#   - threading: the guard runs one thread, so neither the pool's split nor
#     its spinning is counted;
#   - AVX-512: valgrind does not emulate it and reports a processor
#     without it, so the AVX2 copies of the kernels and of gemm are counted;
#     an AVX-512 slowdown shows only in the timed benchmarks;
#   - the build: the cases are built in the dev profile (tapir's crates at
#     opt-level 1, dependencies such as gemm at 3, Cargo.toml), the build CI
#     has already made, not the release build users run.
# Each case is a small, fixed piece of work; the sizes are in benches/icount.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

BASELINE=benches/icount.baseline
TOL="${TAPIR_ICOUNT_TOLERANCE:-5}"
UPDATE=""
if [[ "${1:-}" == "--update" ]]; then
    UPDATE="${2:-}"
    if [[ -z "$UPDATE" ]]; then
        echo "usage: $0 --update \"why the counts changed\"" >&2
        exit 2
    fi
fi

if ! command -v valgrind >/dev/null; then
    echo "icount guard: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi

# The bench target in the dev profile; cargo prints where the binary is.
# `--workspace` resolves every dependency's features as the README's
# `cargo test --workspace` does, so the crates CI's test build compiled are
# reused; without it (the root package alone, fewer features unified) every
# tapir crate and half the dependencies were compiled again, minutes of
# this step.
BIN="$(cargo build --quiet --workspace --bench icount --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "icount" and m.get("executable"):
        print(m["executable"])')"
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
    echo "icount guard: the icount bench binary was not built" >&2
    exit 1
fi
read -r -a CASES <<<"$("$BIN" | sed 's/^cases: //')"

# Instructions executed by one run of a case (the whole process; its
# arguments are passed on).
count() {
    local out
    out="$(RAYON_NUM_THREADS=1 valgrind --tool=cachegrind --cache-sim=no \
        --cachegrind-out-file=/dev/null "$BIN" "$@" 2>&1)" || {
        echo "$out" >&2
        echo "icount guard: case $1 failed" >&2
        return 1
    }
    echo "$out" | sed -n 's/.*I[[:space:]]*refs:[[:space:]]*\([0-9,]*\).*/\1/p' | tr -d ',' | head -1
}

base_of() {
    awk -v c="$1" '$1 == c { print $2 }' "$BASELINE" 2>/dev/null || true
}

start=$(date +%s)
declare -A got
fail=0
printf '%-26s %14s %14s %8s\n' case instructions baseline change
for c in "${CASES[@]}"; do
    n=$(($(count "$c") - $(count "$c" --setup)))
    got[$c]=$n
    b="$(base_of "$c")"
    if [[ -z "$b" ]]; then
        printf '%-26s %14d %14s %8s\n' "$c" "$n" "-" "new"
        [[ -z "$UPDATE" ]] && fail=1
        continue
    fi
    pct="$(python3 -c "print(f'{100 * ($n - $b) / $b:+.2f}')")"
    verdict=""
    if python3 -c "import sys; sys.exit(0 if $n > $b * (1 + $TOL / 100) else 1)"; then
        verdict="  OVER the ${TOL}% tolerance"
        fail=1
    elif python3 -c "import sys; sys.exit(0 if $n < $b * (1 - $TOL / 100) else 1)"; then
        verdict="  (faster: update the baseline to keep the gain)"
    fi
    printf '%-26s %14d %14d %7s%%%s\n' "$c" "$n" "$b" "$pct" "$verdict"
done
echo "(each case less its --setup run; $(($(date +%s) - start)) s)"

if [[ -n "$UPDATE" ]]; then
    tmp="$(mktemp)"
    {
        grep '^#' "$BASELINE" 2>/dev/null || {
            echo "# Instruction counts of benches/icount.rs, one thread, dev profile, checked by"
            echo "# scripts/icount-guard.sh. Each update appends its reason below, then the counts."
        }
        echo "# $(date -u +%Y-%m-%d) $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $UPDATE"
        for c in "${CASES[@]}"; do
            echo "$c ${got[$c]}"
        done
    } >"$tmp"
    mv "$tmp" "$BASELINE"
    echo "wrote $BASELINE"
    exit 0
fi
if [[ $fail -ne 0 ]]; then
    echo "icount guard: a case costs more than ${TOL}% over $BASELINE (or has no baseline)." >&2
    echo "If that is intended, run: scripts/icount-guard.sh --update \"why\" and commit the file." >&2
    exit 1
fi
echo "icount guard: every case within ${TOL}% of its baseline"
