#!/usr/bin/env bash
# CI's rehearsal of the GPU check, without a GPU: whatever would build or
# fetch on the lent machine, or reach back into this checkout, fails here
# first.
#
#   scripts/gpu-rehearse.sh          # after the emulator is built and NVRTC is found
#   GPU_REHEARSE_KEEP=dir scripts/gpu-rehearse.sh   # keep what came back in dir
#
# 1. scripts/gpu-prepare.sh builds the bundle (in the test profile by
#    default, GPU_REHEARSE_PROFILE=release for the real thing: CI has built
#    every test once in that profile already, and a release build of the
#    test binaries takes several minutes more on 2 cores), packs it as the
#    device gets it, and checks the 60 MiB limit in the release profile;
# 2. the working tree, as the device tool sends it (tracked and untracked-
#    not-ignored files) plus the bundle, is copied to another folder, so a
#    path compiled into a program that points back here is found broken;
# 3. scripts/gpu-check.sh runs there with GPU_CHECK_REHEARSAL=1: the
#    emulated device stands in for the GPU, PATH holds no cargo, rustc, pip
#    or rustup (and pip has no index), and NVRTC is found only as on the
#    lent machine, in the wheels' layout of a Python environment on PATH
#    (a fake one here, `nvidia/cu13/lib/libnvrtc.so.13` linked to the NVRTC
#    CI installed; GPU_REHEARSE_NVRTC13=<site-packages> uses a real CUDA 13
#    NVRTC instead), HOME is an empty folder (no pyenv or ~/.local to find
#    libraries in), and the emulated driver reports CUDA 13.0, the lent
#    machine's, so tapir picks its libraries as it will there; the library
#    selection step runs whole, the suite a few CUDA tests
#    (GPU_REHEARSE_FILTER), since CI ran every CUDA test on the emulator
#    already, and bench and memcheck run small; each step's own limit
#    is tripled (GPU_REHEARSE_LIMIT_SCALE), since two busy cores interpret
#    what the device runs on a GPU (the deadline stays the device's);
# 4. what comes back is checked against the device tool's limits: at most
#    8 files of at most 16 MiB (64 MiB together), no deeper than two
#    folders under $OUT, names of letters, digits, '.', '_' and '-'.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
T0=$(date +%s)
STAGE="$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearse.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
BUNDLE="$STAGE/bundle-build"

echo "== prepare (${GPU_REHEARSE_PROFILE:-debug})"
# The test profile's programs are several times the release ones (debug
# information is stripped, but not the unoptimised code): the 60 MiB limit
# is the release bundle's, checked where it is built for the device; here
# the packing runs at xz's fastest level.
if [[ ${GPU_REHEARSE_PROFILE:-debug} == debug ]]; then
    export GPU_PREPARE_LIMIT_MIB="${GPU_PREPARE_LIMIT_MIB:-1024}" GPU_PREPARE_XZ_LEVEL="${GPU_PREPARE_XZ_LEVEL:-0}"
fi
GPU_PREPARE_PROFILE="${GPU_REHEARSE_PROFILE:-debug}" GPU_BUNDLE="$BUNDLE" scripts/gpu-prepare.sh
T1=$(date +%s)

echo "== the working tree as the device gets it, in $STAGE/tree"
mkdir -p "$STAGE/tree"
(git ls-files -z --cached; git ls-files -z --others --exclude-standard) | sort -zu |
    (while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done) |
    tar --null -T - -cf - | tar -xf - -C "$STAGE/tree"
cp -r "$BUNDLE" "$STAGE/tree/gpu-bundle"

# A Python environment on PATH, laid out as the CUDA 13 wheels are, holding
# the only NVRTC the check may find (TAPIR_NVRTC_LIB is unset below).
PY="$(python3 -c 'import sys; print(sys.executable)')"
PYV="$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
VENV="$STAGE/venv"
mkdir -p "$VENV/bin" "$VENV/lib/$PYV/site-packages/nvidia/cu13/lib"
ln -s "$PY" "$VENV/bin/python3"
if [[ -n ${GPU_REHEARSE_NVRTC13:-} ]]; then
    for f in "$GPU_REHEARSE_NVRTC13"/nvidia/cu13/lib/libnvrtc*; do
        ln -s "$f" "$VENV/lib/$PYV/site-packages/nvidia/cu13/lib/"
    done
else
    nvrtc="${TAPIR_NVRTC_LIB:?set TAPIR_NVRTC_LIB to the NVRTC library CI installed}"
    ln -s "$nvrtc" "$VENV/lib/$PYV/site-packages/nvidia/cu13/lib/libnvrtc.so.13"
    # NVRTC opens its builtins library from its own folder.
    for f in "$(dirname "$nvrtc")"/libnvrtc-builtins*; do
        ln -s "$f" "$VENV/lib/$PYV/site-packages/nvidia/cu13/lib/"
    done
fi

# PATH without cargo, rustc, rustup or pip, after the fake environment's
# bin: the folders that hold none of them as they are; a folder that holds
# one (pip beside bash in /usr/bin) through a folder of links to every other
# program in it.
FORBIDDEN=" cargo rustc rustup pip pip3 "
SAFE="$VENV/bin"
LINKS="$STAGE/path-links"
mkdir -p "$LINKS"
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    [[ -z $d || ! -d $d || $d == *cargo* || $d == *rustup* || $d == *pyenv* ]] && continue
    if [[ -e $d/cargo || -e $d/rustc || -e $d/rustup || -e $d/pip || -e $d/pip3 ]]; then
        for f in "$d"/*; do
            n="$(basename "$f")"
            [[ -x $f && ! -d $f && $FORBIDDEN != *" $n "* && ! -e $LINKS/$n ]] && ln -s "$f" "$LINKS/$n"
        done
        [[ :$SAFE: == *:$LINKS:* ]] || SAFE="$SAFE:$LINKS"
        continue
    fi
    SAFE="$SAFE:$d"
done
for t in cargo rustc rustup pip pip3; do
    if PATH="$SAFE" command -v "$t" >/dev/null 2>&1; then
        echo "the rehearsal's PATH still finds $t at $(PATH="$SAFE" command -v "$t")" >&2
        exit 1
    fi
done

echo "== gpu-check.sh, rehearsed on the emulated device"
OUT="$STAGE/out"
mkdir -p "$OUT"
rc=0
(
    cd "$STAGE/tree"
    env -u TAPIR_NVRTC_LIB -u TAPIR_CUDA -u TAPIR_CUDA_EMU_LIB -u CARGO_TARGET_DIR -u VIRTUAL_ENV \
        PATH="$SAFE" OUT="$OUT" PIP_NO_INDEX=1 PIP_INDEX_URL=http://127.0.0.1:9/ \
        GPU_CHECK_REHEARSAL=1 GPU_CHECK_LIMIT_SCALE="${GPU_REHEARSE_LIMIT_SCALE:-3}" HOME="$STAGE/home" TAPIR_CUDA_EMU_DRIVER_VERSION=13000 \
        GPU_CHECK_TEST_FILTER="${GPU_REHEARSE_FILTER:-cuda_add cuda_matmul_f32}" \
        GPU_CHECK_BENCH_ARGS="--only scalar_chain --reps 1 --no-torch" \
        GPU_CHECK_MEMCHECK_ARGS="--only create_graph_cycle --iters 2 --size 0.05 --no-torch" \
        GPU_CHECK_ATTENTION_ARGS="--t 64 --reps 1 --no-torch" \
        GPU_CHECK_REHEARSAL_DEVICES=2 GPU_CHECK_DDP_STEPS=3 \
        GPU_CHECK_DDP_MODEL="--d-model 16 --layers 1 --heads 2 --digits 1 --block 8" \
        bash scripts/gpu-check.sh
) || rc=$?
T2=$(date +%s)

if [[ -n ${GPU_REHEARSE_KEEP:-} ]]; then
    mkdir -p "$GPU_REHEARSE_KEEP" && cp -r "$OUT"/. "$GPU_REHEARSE_KEEP"/
fi
echo "== what comes back ($OUT)"
(cd "$OUT" && find . -type f -printf '%P %s\n')
bad=0
files=$(find "$OUT" -type f | wc -l)
total=$(find "$OUT" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
((files >= 1 && files <= 8)) || { echo "$files files come back; the limit is 8 (and the summary must be one)" >&2 && bad=1; }
((total <= 64 * 1048576)) || { echo "$total bytes come back; the limit is 64 MiB" >&2 && bad=1; }
if find "$OUT" -type f -size +16M | grep -q .; then echo "a file is over 16 MiB" >&2 && bad=1; fi
if find "$OUT" -mindepth 3 | grep -q .; then echo "something is deeper than two folders" >&2 && bad=1; fi
if find "$OUT" -mindepth 1 -printf '%f\n' | grep -v '^[A-Za-z0-9._-]*$' | grep -q .; then
    echo "a name has characters the device tool does not bring back" >&2 && bad=1
fi
[[ -s $OUT/summary.json ]] || { echo "no summary.json" >&2 && bad=1; }
tar -tzf "$OUT/gpu-check.tar.gz" >/dev/null || { echo "the archive does not read back" >&2 && bad=1; }
python3 - "$OUT/summary.json" <<'PY' || bad=1
import json, sys
s = json.load(open(sys.argv[1]))
steps = s["steps"]
for name, v in steps.items():
    print(f"  {name:22} {v['status']:8} {v['seconds']:4} s")
# The steps that need no GPU tool must have run, and passed.
for must in ("machine", "suite", "differential_emu", "differential_gpu", "differential", "attention_cuda", "ddp_cuda"):
    assert steps[must]["status"] == "ok", f"{must}: {steps[must]}"
assert "libnvrtc" in s["libraries"].get("nvrtc", ""), s["libraries"]
# Two emulated devices: tapir's gpt on one and on both, tokens per second of each.
for n in ("tapir-1", "tapir-2"):
    assert s["ddp_cuda"][n]["tokens_per_s"] > 0, s["ddp_cuda"]
print("  libraries in use:", s["libraries"])
PY
echo "== rehearsal: prepare $((T1 - T0)) s, check $((T2 - T1)) s, in all $(($(date +%s) - T0)) s; gpu-check exit $rc"
((rc == 0 && bad == 0))
