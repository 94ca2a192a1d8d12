//! A warp's state: its lanes' registers, program counters and masks, and
//! the lane helpers every stage uses. The stages above give it behaviour:
//! `schedule` runs it, `lower` and `step` execute its instructions.

use crate::ptx::Func;

/// Lanes in a warp.
pub(super) const WARP: usize = 32;
/// Every lane of a warp.
pub(super) const FULL: u32 = u32::MAX;

/// The lanes of a mask, lowest first.
#[inline]
pub(super) fn lanes(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            l
        })
    })
}

/// A device-function call in progress: what the warp returns to.
pub(super) struct Frame {
    pub(super) func: u32,
    pub(super) regs: Vec<u64>,
    pub(super) pcs: [u32; WARP],
    /// The caller's lanes, and those of them that had returned.
    pub(super) mask: u32,
    pub(super) returned: u32,
    /// The lanes that made the call and where they continue.
    pub(super) callers: u32,
    pub(super) ret_pc: u32,
    pub(super) ret_off: Option<u32>,
    pub(super) params: Vec<Vec<u8>>,
    pub(super) local_len: [usize; WARP],
}

/// A warp: its lanes' registers (register `r` of lane `l` at `r * 32 + l`),
/// program counters, and which lanes are where.
pub(super) struct Warp {
    /// The thread index of lane 0.
    pub(super) base: u32,
    /// Lanes that exist (a block's last warp may be partial).
    pub(super) exists: u32,
    pub(super) func: u32,
    pub(super) regs: Vec<u64>,
    pub(super) pcs: [u32; WARP],
    /// Lanes in the current frame (all of them outside calls).
    pub(super) frame: u32,
    pub(super) done: u32,
    /// Lanes parked at `bar.sync`, and at a warp collective.
    pub(super) bar: u32,
    pub(super) coll: u32,
    /// Lanes of the current frame that have returned from it.
    pub(super) returned: u32,
    /// The carry flag of each lane.
    pub(super) cc: u32,
    pub(super) params: Vec<Vec<u8>>,
    pub(super) local: Vec<Vec<u8>>,
    pub(super) frames: Vec<Frame>,
    /// The warp's epoch: collectives completed, which order its lanes'
    /// shared accesses for racecheck.
    pub(super) wep: u32,
}

/// What a warp-instruction does to the group's program counter.
pub(super) enum Flow {
    /// On to the next instruction, with these lanes (a collective may
    /// bring parked lanes along).
    Next(u32),
    /// Every lane of the group branches.
    Jump(u32),
    /// These lanes go to the target, the others of the group to the next
    /// instruction.
    Split(u32, u32),
    /// The group has parked, exited, returned or called: pick again.
    Repick,
}

impl Warp {
    pub(super) fn new(base: u32, n: usize, f: &Func) -> Warp {
        let exists = if n >= WARP { FULL } else { (1u32 << n) - 1 };
        Warp {
            base,
            exists,
            func: 0,
            regs: pooled_regs(f.nregs * WARP),
            pcs: [0; WARP],
            frame: exists,
            done: !exists,
            bar: 0,
            coll: 0,
            returned: 0,
            cc: 0,
            params: vec![Vec::new(); WARP],
            local: vec![Vec::new(); WARP],
            frames: Vec::new(),
            wep: 0,
        }
    }

    /// Lanes that can run now.
    #[inline]
    pub(super) fn runnable(&self) -> u32 {
        self.frame & !(self.done | self.bar | self.coll | self.returned)
    }
}

/// Where a branch to `target` sends the group `active`, of which `exec`
/// take it: all of them, none, or a split.
#[inline(always)]
pub(super) fn branch(active: u32, exec: u32, target: u32) -> Flow {
    if exec == active {
        Flow::Jump(target)
    } else if exec == 0 {
        Flow::Next(active)
    } else {
        Flow::Split(exec, target)
    }
}

/// Register files of finished launches, kept for the next ones: a fresh
/// file of a kernel with a thousand virtual registers is 256 KiB a warp,
/// whose pages the kernel would zero on first touch, for every launch.
static REG_POOL: std::sync::Mutex<Vec<Vec<u64>>> = std::sync::Mutex::new(Vec::new());
/// The most the pool keeps, in registers (64 MiB).
const REG_POOL_MAX: usize = 8 << 20;

/// An empty register file with room for `n` registers, from the pool when
/// it has one: `Worker::block` fills the first block's files with zeros,
/// so what a pooled file held is never read.
fn pooled_regs(n: usize) -> Vec<u64> {
    let mut pool = REG_POOL.lock().unwrap_or_else(|p| p.into_inner());
    match pool.iter().position(|r| r.capacity() >= n) {
        Some(i) => {
            let mut r = pool.swap_remove(i);
            r.clear();
            r
        }
        None => Vec::with_capacity(n),
    }
}

/// Gives a finished worker's register files back to the pool, while it
/// holds less than `REG_POOL_MAX` registers.
pub(super) fn return_regs(files: impl Iterator<Item = Vec<u64>>) {
    let mut pool = REG_POOL.lock().unwrap_or_else(|p| p.into_inner());
    let mut held: usize = pool.iter().map(Vec::capacity).sum();
    for r in files {
        if held + r.capacity() <= REG_POOL_MAX {
            held += r.capacity();
            pool.push(r);
        }
    }
}
