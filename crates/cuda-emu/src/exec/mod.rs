//! The interpreter: runs one launch of a decoded kernel, block by block.
//!
//! Each thread has its own program counter and registers. A block runs its
//! threads one after another, each until it reaches a barrier, a warp
//! collective (`shfl.sync`, `vote.sync`, `bar.warp.sync`) or its exit; a
//! collective completes once every lane of its member mask has arrived,
//! and `bar.sync` once every live thread of the block has. That is one
//! legal schedule of the hardware's, and it makes every access visible to
//! the sanitizer: global accesses are checked against the live
//! allocations, local and shared ones against their sizes, and shared
//! accesses between two barriers against each other (racecheck).

mod numeric;
mod sanitizer;
mod schedule;
mod step;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::memory::Snapshot;
use crate::ptx::Module;
use sanitizer::Shadow;
use schedule::Worker;

/// CUDA_ERROR_ILLEGAL_ADDRESS.
pub const ILLEGAL_ADDRESS: u32 = 700;
/// CUDA_ERROR_MISALIGNED_ADDRESS.
pub const MISALIGNED_ADDRESS: u32 = 716;
/// CUDA_ERROR_LAUNCH_FAILED: used for races, deadlocks and traps.
pub const LAUNCH_FAILED: u32 = 719;

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
    /// Thread-instructions executed (an instruction counted once per thread).
    pub instructions: u64,
}

/// A block being run: its shared memory, the sanitizer's shadow of it, and
/// the launch it belongs to.
pub(crate) struct Block<'a> {
    pub(crate) l: &'a Launch<'a>,
    pub(crate) ctaid: [u32; 3],
    pub(crate) shared: Vec<u8>,
    pub(crate) shadow: Vec<Shadow>,
    pub(crate) gen: u32,
    pub(crate) wep: Vec<u32>,
    /// The last region hit, to skip the search on the next access.
    pub(crate) last: Option<(u64, u64, *mut u8)>,
    pub(crate) count: u64,
}

/// Runs the whole launch. Blocks are handed out in order from a shared
/// counter to `l.workers` host threads; after a fault no block numbered
/// above it starts, and the fault of the lowest-numbered failing block is
/// returned, so the report does not depend on the number of workers.
pub fn run(l: &Launch) -> Result<Stats, Fault> {
    let nblocks = u64::from(l.grid[0]) * u64::from(l.grid[1]) * u64::from(l.grid[2]);
    let workers = (l.workers.max(1) as u64).min(nblocks).max(1) as usize;
    if workers == 1 {
        let mut w = Worker::new(l);
        for id in 0..nblocks {
            w.block(id)?;
        }
        return Ok(Stats { instructions: w.blk.count });
    }
    let next = AtomicU64::new(0);
    let first_fault = AtomicU64::new(u64::MAX);
    let results: Vec<(u64, Option<(u64, Fault)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut w = Worker::new(l);
                    loop {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= nblocks || id > first_fault.load(Ordering::Relaxed) {
                            return (w.blk.count, None);
                        }
                        if let Err(f) = w.block(id) {
                            first_fault.fetch_min(id, Ordering::Relaxed);
                            return (w.blk.count, Some((id, f)));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("internal: an interpreter worker panicked")).collect()
    });
    let instructions = results.iter().map(|r| r.0).sum();
    match results.into_iter().filter_map(|r| r.1).min_by_key(|(id, _)| *id) {
        Some((_, f)) => Err(f),
        None => Ok(Stats { instructions }),
    }
}
