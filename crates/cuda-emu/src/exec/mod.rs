//! The interpreter: runs one launch of a decoded kernel, block by block.
//!
//! The lanes of a warp execute each decoded instruction together under an
//! active mask, diverging at branches and reconverging where their paths
//! meet (`schedule`); a warp runs until its lanes wait at a barrier, at
//! a warp collective whose members have not all arrived, or have exited,
//! and `bar.sync` completes once every live thread of the block waits at
//! it. That is one legal schedule of the hardware's, and it makes every
//! access visible to the sanitizer: global accesses are checked against
//! the live allocations, local and shared ones against their sizes, and
//! shared accesses between two barriers against each other (racecheck).
//!
//! Stages: `warp` (a warp's state), `schedule` (blocks, warps, lanes), `lower` (each instruction
//! lowered once to a lane-loop handler), `step` (one warp-instruction of
//! the instructions without one), `numeric` (PTX arithmetic), `sanitizer`.

mod counters;
mod lower;
mod numeric;
mod sanitizer;
mod schedule;
mod step;
mod warp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::memory::Snapshot;
use crate::ptx::Module;
use counters::Footprint;
pub use counters::{profiling, set_profiling, Class, Counters, BANKS, MMA_FLOPS, NCLASS, SECTOR};
use sanitizer::Shadow;
use schedule::Worker;

/// CUDA_ERROR_ILLEGAL_ADDRESS.
pub const ILLEGAL_ADDRESS: u32 = 700;
/// CUDA_ERROR_MISALIGNED_ADDRESS.
pub const MISALIGNED_ADDRESS: u32 = 716;
/// CUDA_ERROR_LAUNCH_FAILED: used for races, deadlocks and traps.
pub const LAUNCH_FAILED: u32 = 719;
/// CUDA_ERROR_ASSERT: a device-side `assert` failed.
pub const ASSERT: u32 = 710;

/// What device `printf` printed in this process, oldest first (the last
/// 1,024 lines): each call is also written to stderr as it happens.
pub fn printed() -> Vec<String> {
    PRINTED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

static PRINTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn print(s: &str) {
    let mut p = PRINTED.lock().unwrap_or_else(|p| p.into_inner());
    eprint!("{s}");
    if p.len() == 1024 {
        p.remove(0);
    }
    p.push(s.to_string());
}

/// Why a launch failed: the driver's code and a message naming the
/// kernel, block, thread and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: u32,
    pub message: String,
}

/// One launch.
pub struct Launch<'a> {
    pub module: &'a Module,
    pub func: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dyn_shared: u32,
    /// The kernel's parameter area, laid out as its `.entry` says.
    pub params: &'a [u8],
    pub mem: &'a Snapshot,
    /// Whether shared-memory hazards fail the launch.
    pub racecheck: bool,
    /// Host threads to run blocks on (1: one after another on the caller's).
    pub workers: usize,
}

/// What a launch did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Thread-instructions executed (an instruction counted once per
    /// thread that fetched it, guard false or not).
    pub instructions: u64,
    /// The launch's counters.
    pub counters: Counters,
}

/// The counters of every kernel run so far in this process, by name, in
/// the order the kernels first ran (what a profiler's summary reads).
pub fn kernel_counters() -> Vec<(String, Counters)> {
    KERNELS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

static KERNELS: Mutex<Vec<(String, Counters)>> = Mutex::new(Vec::new());

fn record(name: &str, c: &Counters) {
    let mut k = KERNELS.lock().unwrap_or_else(|p| p.into_inner());
    match k.iter_mut().find(|(n, _)| n == name) {
        Some((_, t)) => t.add(c),
        None => k.push((name.to_string(), *c)),
    }
}

/// A block being run: its shared memory, the sanitizer's shadow of it, and
/// the launch it belongs to.
pub(crate) struct Block<'a> {
    pub(crate) l: &'a Launch<'a>,
    pub(crate) ctaid: [u32; 3],
    pub(crate) shared: Vec<u8>,
    pub(crate) shadow: Vec<Shadow>,
    pub(crate) gen: u32,
    /// The last region hit, to skip the search on the next access: its
    /// base, length, host address and initcheck shadow.
    pub(crate) last: Option<(u64, u64, *mut u8, Option<&'a [AtomicU64]>)>,
    pub(crate) counters: Counters,
    /// Whether every lane's parameter area holds the launch's parameters
    /// throughout (the kernel stores to none and calls nothing), so an
    /// `ld.param` at a fixed offset reads the same for every lane.
    pub(crate) params_uniform: bool,
    /// Whether this launch counts the profiler's counters, and the sectors
    /// its blocks touched so far.
    prof: bool,
    fp: Footprint,
}

/// Runs the whole launch. Blocks are handed out in order from a shared
/// counter to `l.workers` host threads; after a fault no block numbered
/// above it starts, and the fault of the lowest-numbered failing block is
/// returned, so the report does not depend on the number of workers.
pub fn run(l: &Launch) -> Result<Stats, Fault> {
    let nblocks = u64::from(l.grid[0]) * u64::from(l.grid[1]) * u64::from(l.grid[2]);
    let workers = (l.workers.max(1) as u64).min(nblocks).max(1) as usize;
    let prof = profiling();
    let mut counters = Counters { launches: 1, ..Counters::default() };
    let mut fp = Footprint::default();
    if workers == 1 {
        let mut w = Worker::new(l, prof);
        for id in 0..nblocks {
            w.block(id)?;
        }
        counters.add(&w.blk.counters);
        fp = std::mem::take(&mut w.blk.fp);
    } else {
        let next = AtomicU64::new(0);
        let first_fault = AtomicU64::new(u64::MAX);
        type Done = (Counters, Footprint, Option<(u64, Fault)>);
        let results: Vec<Done> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut w = Worker::new(l, prof);
                        loop {
                            let id = next.fetch_add(1, Ordering::Relaxed);
                            if id >= nblocks || id > first_fault.load(Ordering::Relaxed) {
                                return (w.blk.counters, std::mem::take(&mut w.blk.fp), None);
                            }
                            if let Err(f) = w.block(id) {
                                first_fault.fetch_min(id, Ordering::Relaxed);
                                return (w.blk.counters, std::mem::take(&mut w.blk.fp), Some((id, f)));
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("internal: an interpreter worker panicked")).collect()
        });
        let mut fault = None;
        for (c, f, e) in results {
            counters.add(&c);
            fp.merge(f);
            if let Some((id, e)) = e {
                if fault.as_ref().is_none_or(|(i, _)| id < *i) {
                    fault = Some((id, e));
                }
            }
        }
        if let Some((_, f)) = fault {
            return Err(f);
        }
    }
    let f = &l.module.funcs[l.func];
    counters.block_threads = u64::from(l.block[0] * l.block[1] * l.block[2]);
    counters.block_shared = u64::from(f.shared_size) + u64::from(l.dyn_shared);
    if prof {
        fp.finish(&mut counters);
    }
    record(&f.name, &counters);
    Ok(Stats { instructions: counters.thread_instructions, counters })
}
