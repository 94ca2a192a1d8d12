#!/usr/bin/env bash
# CI: data parallelism over real MPI ranks (crates/nn/tests/dist.rs launches
# its own test binary under `mpirun`, 2 and 4 ranks on this machine;
# crates/cli/tests/dist_commands.rs runs `tapir gpt`, `tapir pinn` and `tapir allreduce` with --dist mpi
# on 2 ranks, on the CPU and, over NCCL's stand-in, on the emulated devices of .ci/run's environment).
# Installs Open MPI and what the `mpi` crate's build needs (libclang for its
# bindings) from the system packages when they are missing; TAPIR_REQUIRE_MPI=1
# turns a missing mpirun into a failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || ! ldconfig -p | grep -Eq 'libclang(-[0-9.]+)?\.so'; then  # libclang itself, not libclang-cpp
    echo "== installing Open MPI and libclang (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq openmpi-bin libopenmpi-dev libclang-dev >/dev/null
fi
mpirun --version | head -1

# --workspace keeps every other crate's features as in the main test build,
# so only tapir-nn and what depends on it are rebuilt with the feature.
echo "== data-parallel tests on MPI ranks"
TAPIR_REQUIRE_MPI=1 cargo test --workspace --features tapir-nn/mpi,tapir-cli/mpi --test dist --test dist_commands
