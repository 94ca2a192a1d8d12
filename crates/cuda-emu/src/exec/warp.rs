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

/// The lanes whose value in `r` is not zero, as a mask: a guard's lanes.
/// Four lanes a compare where the host has AVX2 (the build targets plain
/// x86-64, where the loop is a compare, a set and a shift for each lane).
#[inline(always)]
pub(super) fn nonzero_lanes(r: &[u64; WARP]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature.
        return unsafe { nonzero_lanes_avx2(r) };
    }
    let mut g = 0u32;
    for (l, v) in r.iter().enumerate() {
        g |= u32::from(*v != 0) << l;
    }
    g
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn nonzero_lanes_avx2(r: &[u64; WARP]) -> u32 {
    use std::arch::x86_64::{__m256i, _mm256_setzero_si256};
    use std::arch::x86_64::{_mm256_castsi256_pd, _mm256_cmpeq_epi64, _mm256_loadu_si256, _mm256_movemask_pd};
    let zero = _mm256_setzero_si256();
    let mut zeros = 0u32;
    for (k, four) in r.chunks_exact(4).enumerate() {
        // SAFETY: `four` is 4 u64, 32 bytes; the load is unaligned.
        let v = unsafe { _mm256_loadu_si256(four.as_ptr().cast::<__m256i>()) };
        let z = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(v, zero))) as u32;
        zeros |= z << (4 * k);
    }
    !zeros
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonzero_lanes_is_the_mask_of_the_lanes_not_zero() {
        let mut r = [0u64; WARP];
        assert_eq!(nonzero_lanes(&r), 0);
        for (l, v) in r.iter_mut().enumerate() {
            // Values of every width, and zeros between them.
            *v = if l % 3 == 0 { 0 } else { 1u64 << (l * 7 % 64) };
        }
        let want = (0..WARP).filter(|l| l % 3 != 0).fold(0u32, |m, l| m | 1 << l);
        assert_eq!(nonzero_lanes(&r), want);
        r = [u64::MAX; WARP];
        assert_eq!(nonzero_lanes(&r), FULL);
        r[31] = 0;
        r[0] = 0;
        assert_eq!(nonzero_lanes(&r), FULL & !(1 << 31) & !1);
    }
}
