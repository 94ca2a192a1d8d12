//! The `tapir` command.

use clap::{Parser, Subcommand};

use tapir_cli::{allreduce, bench, gpt, memcheck, pinn, profile};

/// Large buffers on cache lines, as PyTorch's are: a row of a large tensor
/// otherwise starts 16 bytes into a line (tapir::AlignedAlloc).
#[global_allocator]
static ALLOC: tapir::AlignedAlloc = tapir::AlignedAlloc;

/// tapir: a pure-Rust autograd engine whose graphs cannot leak.
///
/// Every command runs on the CPU unless given `--device cuda`, `cuda:N` or
/// `auto` (CUDA when present, else the CPU).
#[derive(Parser)]
#[command(name = "tapir", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs PyTorch's memory-leak patterns in tapir (and in PyTorch when
    /// python3 can import torch) and reports memory growth side by side.
    Memcheck(memcheck::Args),
    /// Trains a physics-informed network on a PDE with a known solution.
    Pinn(pinn::Args),
    /// Times autograd, Hessian and Laplacian workloads beside PyTorch.
    Bench(bench::Args),
    /// Trains a character-level mini-GPT (built-in sums task, or --data FILE).
    Gpt(gpt::Args),
    /// Runs a case on the emulated CUDA device and prints each kernel's
    /// counters and modeled H200 time, like a profiler's kernel summary.
    Profile(profile::Args),
    /// Times the all-reduce over the ranks of a job (`mpirun ... --dist
    /// mpi`), tapir's beside MPI's or NCCL's own call.
    Allreduce(allreduce::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Memcheck(a) => memcheck::run(a),
        Command::Pinn(a) => pinn::run(a),
        Command::Gpt(a) => gpt::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Allreduce(a) => allreduce::run(a),
    }
}
