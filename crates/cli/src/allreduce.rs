//! `tapir allreduce`: the all-reduce's time and bandwidth over the ranks of
//! a job, tapir's [`Communicator::all_reduce`] beside the engine's own call
//! on a buffer of the same size, in one run (osu_allreduce's measure, and
//! nccl-tests' bus bandwidth). On CPU ranks (`--dist mpi`) the engine's
//! call is `MPI_Allreduce` through the `mpi` crate; on CUDA ranks
//! (`--dist mpi --device cuda:N`, or one process's devices) it is NCCL's
//! all-reduce with nothing of tapir around it. tapir's call adds its
//! shape-and-dtype agreement across ranks (one small all-gather) and, on
//! the CPU, a copy of the input; what that costs is the ratio printed.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use tapir::nn::dist::{Communicator, ReduceOp};
use tapir::prelude::*;

use crate::device::DeviceArg;
use crate::gpt::{communicator, Dist};

/// Arguments of `tapir allreduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Message sizes in bytes of f32 (a K or M suffix is 1024 or 1024^2).
    #[arg(long, value_delimiter = ',', default_value = "4K,64K,1M,16M")]
    pub sizes: Vec<String>,
    /// All-reduces per timed block (three blocks a side, alternating; the
    /// fastest block counts).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Where the buffers live: cpu, or cuda:N (with `--dist mpi`, each
    /// rank's own GPU from N on, reduced by NCCL).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// The ranks: `mpi` under `mpirun -np N` (a build with `--features mpi`).
    #[arg(long, value_enum, default_value_t = Dist::None)]
    pub dist: Dist,
    /// Write the figures as JSON here (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A size such as `4K`, `1M` or `4096`, in bytes.
fn parse_size(s: &str) -> anyhow::Result<usize> {
    let t = s.trim();
    let (num, unit) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1024),
        Some('M' | 'm') => (&t[..t.len() - 1], 1024 * 1024),
        _ => (t, 1),
    };
    let n: usize = num.parse().with_context(|| format!("--sizes: {s:?} is not a size (4096, 64K or 16M)"))?;
    match n.checked_mul(unit) {
        Some(b) if b >= 4 && b.is_multiple_of(4) && b <= 1 << 34 => Ok(b),
        _ => bail!("--sizes: {s} is not a positive multiple of 4 bytes (one f32) of at most 16 GiB"),
    }
}

/// One size's figures: seconds an all-reduce, the slowest rank's.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Bytes of the buffer.
    pub bytes: usize,
    /// tapir's `Communicator::all_reduce`.
    pub tapir_s: f64,
    /// The engine's own call.
    pub engine_s: f64,
}

/// The engine's all-reduce alone, in place, sum.
type EngineCall<'a> = Box<dyn FnMut(&mut Tensor) -> anyhow::Result<()> + 'a>;

/// The engine's own all-reduce for this communicator, with nothing of
/// tapir around it, and its name.
fn engine<'a>(comm: &'a Communicator) -> anyhow::Result<(EngineCall<'a>, &'static str)> {
    if let Some(d) = comm.backend().device() {
        return Ok((Box::new(move |t: &mut Tensor| Ok(d.all_reduce(t, ReduceOp::Sum)?)), "NCCL's all-reduce"));
    }
    mpi_engine(comm)
}

#[cfg(feature = "mpi")]
fn mpi_engine<'a>(comm: &'a Communicator) -> anyhow::Result<(EngineCall<'a>, &'static str)> {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    if comm.world_size() == 1 {
        return Ok((Box::new(|_: &mut Tensor| Ok(())), "nothing (one rank)"));
    }
    let world = mpi::topology::SimpleCommunicator::world();
    // Its sum checked once, as tapir's is: each rank gives rank + 1.
    let n = comm.world_size();
    let mut sum = [0f32; 4];
    world.all_reduce_into(&[(comm.rank() + 1) as f32; 4][..], &mut sum[..], SystemOperation::sum());
    if sum.iter().any(|&v| v != (n * (n + 1) / 2) as f32) {
        bail!("rank {}: MPI_Allreduce gave {} where the sum is {}", comm.rank(), sum[0], n * (n + 1) / 2);
    }
    let mut recv: Vec<f32> = Vec::new();
    let call = move |t: &mut Tensor| -> anyhow::Result<()> {
        let send = t.as_slice::<f32>().context("an f32 host buffer")?;
        recv.resize(send.len(), 0.0);
        world.all_reduce_into(send, &mut recv[..], SystemOperation::sum());
        Ok(())
    };
    Ok((Box::new(call), "MPI_Allreduce"))
}

#[cfg(not(feature = "mpi"))]
fn mpi_engine<'a>(comm: &'a Communicator) -> anyhow::Result<(EngineCall<'a>, &'static str)> {
    if comm.world_size() > 1 {
        bail!("internal: several ranks without MPI or NCCL");
    }
    Ok((Box::new(|_: &mut Tensor| Ok(())), "nothing (one rank)"))
}

/// Seconds a call of `f`, the fastest of three blocks of `iters`, after the
/// ranks meet (so a block starts together on every rank) and with the
/// device's queue drained before the clock stops.
fn block_time(
    comm: &Communicator,
    device: Device,
    iters: usize,
    f: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    comm.barrier()?;
    tapir::tensor::cuda::synchronize(device)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    tapir::tensor::cuda::synchronize(device)?;
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// One row a size, each the slowest rank's times.
    pub rows: Vec<Row>,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// What tapir was compared with.
    pub engine: &'static str,
    /// Where the buffers were.
    pub device: Device,
}

/// Measures every size.
pub fn measure(a: &Args) -> anyhow::Result<Measured> {
    let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<anyhow::Result<_>>()?;
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let (comm, device, _) = communicator(a.dist, a.device)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let (mut engine_call, engine_name) = engine(&comm)?;
    // Each rank's value is its rank + 1: the sum is n (n + 1) / 2 on every
    // rank, by tapir and by the engine alike, before anything is timed.
    let want = (world * (world + 1) / 2) as f32;
    // (MPI's own call, which writes elsewhere, is checked where it is made.)
    let in_place = comm.backend().device().is_some();
    for (name, use_tapir) in [("tapir", true), (engine_name, false)] {
        if !use_tapir && !in_place {
            continue;
        }
        let mut t = Tensor::full_on([1024], (rank + 1) as f64, DType::F32, device)?;
        if use_tapir {
            comm.all_reduce(&mut t, ReduceOp::Sum)?;
        } else {
            engine_call(&mut t)?;
        }
        let got = t.to_vec::<f32>()?;
        if got.iter().any(|&v| v != want) {
            bail!("rank {rank}: {name}'s all-reduce gave {} where the sum is {want}", got[0]);
        }
    }
    let mut rows = Vec::new();
    for &bytes in &sizes {
        // Zeros: the sums stay zero however many times they run.
        let mut t = Tensor::zeros_on([bytes / 4], DType::F32, device)?;
        let (mut tapir_s, mut engine_s) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..3 {
            let s = block_time(&comm, device, a.iters, &mut || Ok(comm.all_reduce(&mut t, ReduceOp::Sum)?))?;
            tapir_s = tapir_s.min(s);
            let s = block_time(&comm, device, a.iters, &mut || engine_call(&mut t))?;
            engine_s = engine_s.min(s);
        }
        // The slowest rank's figures.
        let mut slowest = Tensor::from_vec(vec![tapir_s, engine_s], [2])?.to_device(device)?;
        comm.all_reduce(&mut slowest, ReduceOp::Max)?;
        let v = slowest.to_vec::<f64>()?;
        rows.push(Row { bytes, tapir_s: v[0], engine_s: v[1] });
    }
    Ok(Measured { rows, rank, world, engine: engine_name, device })
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The command.
pub fn run(a: Args) -> anyhow::Result<()> {
    let Measured { rows, rank, world, engine: engine_name, device } = measure(&a)?;
    // Rank 0 speaks for the job.
    if rank != 0 {
        return Ok(());
    }
    println!(
        "all-reduce (sum, f32) over {world} rank{} on {device}: tapir's Communicator::all_reduce beside {engine_name}, \
         the slowest rank's time, the fastest of 3 blocks of {} each",
        if world == 1 { "" } else { "s" },
        a.iters
    );
    println!(
        "{:>10} {:>12} {:>12} {:>8} {:>14} {:>14}",
        "size", "tapir us", "engine us", "ratio", "tapir busbw", "engine busbw"
    );
    // nccl-tests' bus bandwidth: what each link carries in a ring.
    let bus = |bytes: usize, s: f64| bytes as f64 / s * 2.0 * (world as f64 - 1.0) / world as f64 / 1e9;
    for r in &rows {
        println!(
            "{:>10} {:>12.1} {:>12.1} {:>7.2}x {:>9.2} GB/s {:>9.2} GB/s",
            human(r.bytes),
            r.tapir_s * 1e6,
            r.engine_s * 1e6,
            r.tapir_s / r.engine_s,
            bus(r.bytes, r.tapir_s),
            bus(r.bytes, r.engine_s)
        );
    }
    if let Some(path) = &a.json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"bytes": r.bytes, "tapir_s": r.tapir_s, "engine_s": r.engine_s}))
            .collect();
        let v = serde_json::json!({"world": world, "device": device.to_string(), "engine": engine_name, "rows": rows});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
